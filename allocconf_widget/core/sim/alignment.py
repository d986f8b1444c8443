"""How many recorded segment events a replay reproduced, in order, in bounded time.

The self-check scores a replay by the events it matched in order (:func:`.result.compare_segments`),
as :class:`difflib.SequenceMatcher` aligns them: it finds the longest common run, then recurses on
either side. On the long identical runs a faithful replay produces that is near-linear; on a trace
of a few sizes repeated thousands of times every search walks every equal pair, and the recursion
multiplies it into minutes for a trace of two alternating sizes, and the self-check runs once
per release the version inference tries. Here the same recursion is run with a
budget on that work; once spent, what is left of each unaligned stretch is matched greedily (in
order, looking a few events ahead), so a score is never higher than an alignment that exists.
Within the budget the count is difflib's, to the event.

Standard library only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher

#: equal pairs the longest-run searches may walk in all (a bounded fraction of a second)
SEARCH_BUDGET = 1_000_000
#: how far ahead the greedy matcher looks for the next equal event
LOOKAHEAD = 32


def matched_in_order(rec: Sequence[Hashable], sim: Sequence[Hashable],
                     budget: int = SEARCH_BUDGET) -> int:
    """Events of ``rec`` matched in order by events of ``sim``: difflib's matching blocks while
    their searches stay within ``budget`` equal pairs, then a greedy match of the rest."""
    matcher = SequenceMatcher(None, rec, sim, autojunk=False)
    counts = Counter(sim)
    # one search over rec[alo:ahi] walks at most this many positions of sim per event of rec
    most = max(counts.values(), default=0)
    matched = 0
    queue = [(0, len(rec), 0, len(sim))]
    while queue:
        alo, ahi, blo, bhi = queue.pop()
        cost = (ahi - alo) * min(most, bhi - blo)
        if cost > budget:
            matched += _greedy(rec[alo:ahi], sim[blo:bhi])
            continue
        budget -= cost
        i, j, k = matcher.find_longest_match(alo, ahi, blo, bhi)
        if not k:
            continue
        matched += k
        if alo < i and blo < j:
            queue.append((alo, i, blo, j))
        if i + k < ahi and j + k < bhi:
            queue.append((i + k, ahi, j + k, bhi))
    return matched


def _greedy(rec: Sequence[Hashable], sim: Sequence[Hashable]) -> int:
    """Equal events matched in order, each side looking up to :data:`LOOKAHEAD` events ahead
    for the other's next one (the nearer wins); linear in the two lengths."""
    i = j = matched = 0
    while i < len(rec) and j < len(sim):
        if rec[i] == sim[j]:
            matched += 1
            i += 1
            j += 1
            continue
        ahead_sim = _find(sim, rec[i], j + 1)
        ahead_rec = _find(rec, sim[j], i + 1)
        if ahead_sim is not None and (ahead_rec is None or ahead_sim - j <= ahead_rec - i):
            j = ahead_sim
        elif ahead_rec is not None:
            i = ahead_rec
        else:
            i += 1
            j += 1
    return matched


def _find(seq: Sequence[Hashable], item: Hashable, start: int) -> int | None:
    for pos in range(start, min(start + LOOKAHEAD, len(seq))):
        if seq[pos] == item:
            return pos
    return None
