"""Our own warnings said as our notes: once each, without a file path and source line.

The settings checks raise :class:`~allocconf_widget._errors.AllocConfWarning` through
``warnings``, which suits library callers. A front end that prints its own ``note:`` lines
(``%allocconf simulate``) collects them instead: Python's warning display showed the install
path and a source line of ours, and the same warning could come once per replayed setting.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from allocconf_widget._errors import AllocConfWarning


@contextmanager
def warnings_as_notes() -> Iterator[list[str]]:
    """Collect our warnings raised inside the block into the yielded list (filled on exit,
    in order, each text once). Anyone else's warnings go on as they would have."""
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AllocConfWarning)
        yield notes
    for item in caught:
        if issubclass(item.category, AllocConfWarning):
            if str(item.message) not in notes:
                notes.append(str(item.message))
        else:
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
