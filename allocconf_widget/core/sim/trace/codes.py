"""The operation and segment-event codes of a decoded trace's integer columns."""

from __future__ import annotations

OP_ALLOC = 0
OP_FREE = 1  # free_requested + free_completed at once
OP_FREE_REQUESTED = 2  # allocated drops; block stays unusable (record_stream)
OP_FREE_COMPLETED = 3  # pending block returns to the cache
OP_OOM = 4  # a recorded OOM: retry the request (size is already rounded)
#: ``torch.cuda.empty_cache()``, called by the program or inferred from a release burst. Its size
#: is 0 when the release is certainly ``empty_cache()``; otherwise the reserved bytes the next
#: recorded segment needed (reserved before the burst + its size): the burst was malloc's OOM
#: path if and only if that did not fit under the recorded limit.
OP_EMPTY_CACHE = 5
# 6 is ``limits.OP_SET_LIMIT``: the program changed its memory fraction (size: the fraction
# in billionths); :mod:`..limits` inserts those rows after decoding.
#: Only in :meth:`.model.Trace.replay_columns`: an ``OP_ALLOC`` whose own ``OP_FREE`` is the next
#: row (a temporary). Where the cache serves it, the replay skips both rows (``engine.run_ops``).
OP_ALLOC_FREED_NEXT = 7

SEG_ALLOC = 0
SEG_FREE = 1
SEG_MAP = 2
SEG_UNMAP = 3
SEG_NAMES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
