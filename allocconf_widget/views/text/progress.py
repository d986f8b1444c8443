"""Progress of a dry run or a plan: ``tqdm.auto`` where it is installed (Colab ships it), one text
line rewritten in place otherwise. Nothing is shown for work that ends within :data:`DELAY`."""

from __future__ import annotations

import sys
import time
from typing import Any

#: seconds of work before any progress is shown
DELAY = 0.5


class ProgressLine:
    """``update(done, detail)`` as work goes; ``close()`` when it ends (also after an error)."""

    def __init__(self, what: str, *, total: int | None = None, unit: str = "it", stream: Any = None,
                 every: float = 0.25) -> None:
        """``every``: seconds between two redraws of the text line (0: each update)."""
        self._what, self._total, self._unit = what, total, unit
        self._every = every
        self._stream = stream
        self._started = time.monotonic()
        self._bar: Any = None
        self._shown = False
        self._last = 0.0
        self._done = 0
        try:
            import importlib

            self._tqdm: Any = importlib.import_module("tqdm.auto").tqdm
        except (ImportError, AttributeError):
            self._tqdm = None

    def update(self, done: int, detail: str = "") -> None:
        self._done = done
        now = time.monotonic()
        if now - self._started < DELAY:
            return
        if self._tqdm is not None:
            if self._bar is None:
                # no monitor thread: a dry run would take a thread started inside it for the step's
                self._tqdm.monitor_interval = 0
                self._bar = self._tqdm(total=self._total, desc=self._what, unit=self._unit, leave=False,
                                       file=self._stream)
            self._bar.n = done
            if detail:
                self._bar.set_postfix_str(detail, refresh=False)
            self._bar.refresh()
            return
        if now - self._last < self._every and done != self._total:
            return
        self._last = now
        count = f"{done:,}/{self._total:,}" if self._total else f"{done:,}"
        text = f"{self._what}: {count} {self._unit}" + (f" ({detail})" if detail else "")
        stream = self._stream or sys.stdout
        stream.write(f"\r{text[:150]:<150}")
        stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._shown:
            stream = self._stream or sys.stdout
            stream.write("\r" + " " * 150 + "\r")
            stream.flush()
            self._shown = False
