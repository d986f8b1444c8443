"""Pause Python's cyclic garbage collector around bulk work that makes no lasting cycles.

Unpickling a snapshot makes millions of dicts and decoding walks them; each full collection
on the way walks every live object, so a 1M-entry snapshot paid for dozens of walks over
millions of objects it was still building. Reference counting still frees everything; the
collector runs again (and catches any cycle) as soon as the block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-entrant: the outermost restores it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
