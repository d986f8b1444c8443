"""Differential test: our parser against torch's own, over thousands of generated strings.

The installed torch (the CPU build of 2.13 in CI) validates the *generic*
allocator keys through ``torch._C._accelerator_setAllocatorSettings`` without
any GPU. It accepts unknown keys silently on a CPU build (no CUDA hook is
registered) and it is stateful (``large_segment_size_mb`` persists, even from
a call that fails midway), so every string is preceded by a reset and only
generic keys are generated.

Two properties are checked:

1. **never accept what torch rejects** — for every generated string;
2. **accept every well-formed string torch accepts** — where *well-formed*
   is decided by the generator, independently of our parser: it knows when it
   injected something torch would misread (signs, exponents, decimals in
   integers, junk, glued words, clamped sizes, unsorted or lone-'>' lists)
   or a structural slip (trailing commas, '=' ...).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from allocconf_widget import AllocConfError, parse_conf
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.versions import parse_version
from tests.oracle_strings import make_case

torch = pytest.importorskip("torch")
SETTER: Any = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
pytestmark = pytest.mark.skipif(SETTER is None, reason="this torch has no generic allocator setter")

VERSION = parse_version(torch.__version__)
# Generic keys (docs/internals/allocator_facts.md §3: the 2.10+ generic parser), written out
# independently of our schema.
GENERIC_KEYS = {
    "max_split_size_mb": (2, 10), "max_non_split_rounding_mb": (2, 10),
    "garbage_collection_threshold": (2, 10), "roundup_power2_divisions": (2, 10),
    "expandable_segments": (2, 10), "pinned_use_background_threads": (2, 10),
    "large_segment_size_mb": (2, 11), "pinned_max_round_threshold_mb": (2, 13),
    "pinned_max_cached_size_mb": (2, 13),
}
KEYS = sorted(k for k, since in GENERIC_KEYS.items() if since <= VERSION)
def torch_accepts(text: str) -> bool:
    SETTER("large_segment_size_mb:20")  # undo state a previous (even failing) call left
    try:
        SETTER(text)
    except (RuntimeError, ValueError, IndexError, TypeError):
        return False
    return True


def ours_accepts(text: str) -> bool:
    try:
        parse_conf(text, VERSION, warn=False)
    except AllocConfError:
        return False
    return True


def test_our_generic_keys_match_the_independent_list():
    ours = {s.name for s in opt.options_for(VERSION) if s.scope_in(VERSION) is opt.Scope.GENERIC}
    assert ours == set(KEYS)


def test_differential_against_torch_parser():
    rng = random.Random(20261202)
    cases = [make_case(rng, KEYS) for _ in range(20_000)]
    accepted_by_us_rejected_by_torch = []
    rejected_well_formed = []
    counts = {"torch_accepts": 0, "we_accept": 0, "well_formed": 0}
    for case in cases:
        theirs, ours = torch_accepts(case.text), ours_accepts(case.text)
        counts["torch_accepts"] += theirs
        counts["we_accept"] += ours
        counts["well_formed"] += case.well_formed
        if ours and not theirs:
            accepted_by_us_rejected_by_torch.append(case.text)
        if case.well_formed and theirs and not ours:
            rejected_well_formed.append(case.text)
    print(f"\n{len(cases)} strings against torch {torch.__version__}: {counts}")
    # the generator must exercise both sides, or the properties below prove nothing
    assert counts["torch_accepts"] > 1000 and len(cases) - counts["torch_accepts"] > 1000
    assert counts["we_accept"] > 500
    assert accepted_by_us_rejected_by_torch == []
    assert rejected_well_formed == []


@pytest.mark.parametrize(
    "text",
    ["max_split_size_mb:-5", "max_split_size_mb:25e3", "max_split_size_mb:512.5",
     "garbage_collection_threshold:0.5x", "max_split_size_mb:1 28",
     "roundup_power2_divisions:[256:1]junk", "expandable_segments:True]"],
)
def test_torch_really_accepts_what_we_call_misread(text):
    """Keeps the 'misread' category honest: these must stay accepted by torch itself."""
    assert torch_accepts(text)
    assert not ours_accepts(text)


# What Python's str.isspace() calls whitespace but C's std::isspace does not, plus the C
# whitespace itself, controls, format characters and look-alikes that arrive by copy-paste.
UNICODE_TRAPS = (
    [chr(c) for c in range(0x00, 0x20)] + ["\x7f", "\x85", "\xa0", "\u1680"]
    + [chr(c) for c in range(0x2000, 0x200B)]
    + ["\u200b", "\u200c", "\u200d", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
       "\ufeff", "\u00ad", "\u2060", "\uff1a", "\uff0c"]
)


def test_unicode_whitespace_and_control_characters_never_falsely_accepted():
    """>= 3,000 strings with one or two such characters spliced in anywhere: 0 false accepts."""
    rng = random.Random(3000)
    base = [make_case(rng, KEYS).text for _ in range(400)]
    base = [t for t in base if torch_accepts(t)] or ["expandable_segments:True"]
    false_accepts, torch_rejected, total = [], 0, 0
    for i in range(3_200):
        text = base[i % len(base)]
        for _ in range(1 + i % 2):
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice(UNICODE_TRAPS) + text[at:]
        total += 1
        theirs = torch_accepts(text)
        torch_rejected += not theirs
        if ours_accepts(text) and not theirs:
            false_accepts.append(text)
    print(f"\n{total} unicode/control strings: torch rejected {torch_rejected}, "
          f"false accepts {len(false_accepts)}")
    # most splices land in a key, which a CPU build ignores as unknown (so "accepts"): we
    # reject those on purpose, since the option would silently not apply
    assert total >= 3_000 and torch_rejected > 200
    assert false_accepts == []
