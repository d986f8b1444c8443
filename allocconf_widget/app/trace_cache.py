"""The session's step, decoded once, and the answers computed from it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeVar, cast

from allocconf_widget.app.sources import RecordingHolder, TraceSource, trace_source

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace

T = TypeVar("T")


class TraceCache:
    """The session's last trace source and its decoded trace, so a second Compare does not
    decode again.

    Keyed by the session's recording *token* (a counter the Session bumps for every new
    ``%%allocconf record``), never by ``id()``: a new recording can sit at a freed one's
    address, and an ``id()`` key then answered with the old cell's trace.
    """

    #: answers kept per trace (the Settings tab asks again for every slider position it revisits)
    MEMO_LIMIT = 64

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._key: tuple[str, int] | None = None
        self._source: TraceSource | None = None
        self._trace: Trace | None = None
        self._memo: dict[Hashable, object] = {}

    def get(self, session: RecordingHolder) -> tuple[TraceSource, Trace]:
        """The session's trace source and its decoded trace (decoded once per source)."""
        with self._lock:
            key = session.recording_key()
            if self._source is None or self._trace is None or key != self._key:
                source = trace_source(session)
                trace = source.trace()
                self._key, self._source, self._trace = key, source, trace
                self._memo.clear()  # answers about the old trace are not answers about this one
            return self._source, self._trace

    def memo(self, session: RecordingHolder, question: Hashable,
             answer: Callable[[TraceSource, Trace], T]) -> T:
        """``answer(source, trace)`` for the session's current trace, computed once per
        ``question`` while that trace stays (the oldest answers go past :attr:`MEMO_LIMIT`)."""
        with self._lock:
            source, trace = self.get(session)
            if question in self._memo:
                return cast(T, self._memo[question])
            value = answer(source, trace)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.pop(next(iter(self._memo)))
            self._memo[question] = value
            return value
