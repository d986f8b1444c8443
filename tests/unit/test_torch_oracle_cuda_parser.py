"""Differential test against an older release's own CUDA parser (torch 1.13 to 2.9).

Before 2.10 one CUDA parser handled every key (docs/internals/allocator_facts.md §3), and
PyPI's builds of those releases are CUDA builds:
``torch._C._cuda_cudaCachingAllocator_set_allocator_settings`` parses a string on a machine
without a GPU, without initialising CUDA. CI's torch 1.13.0 and
2.4.1 cells run this; on 2.10+ (the generic parser) ``test_torch_oracle.py`` does the same job,
and on a CPU build of an older torch there is no such parser and this module skips.

Property checked: we never accept a string that release rejects. (The reverse, "accept every
well-formed string it accepts", is checked only on 2.10+, where the string generator's notion
of well-formed matches the parser.)
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from allocconf_widget import AllocConfError, parse_conf
from allocconf_widget.core.versions import parse_version
from tests.oracle_strings import make_case

torch = pytest.importorskip("torch")
SETTER: Any = getattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings", None)
VERSION = parse_version(torch.__version__)
pytestmark = pytest.mark.skipif(
    SETTER is None or VERSION.key >= (2, 10),
    reason=f"torch {torch.__version__}: no pre-2.10 CUDA parser to ask (a CPU build, or 2.10+)")

# Keys each release's CUDA parser knows, written out from torch's source independently of our schema.
KEYS_SINCE = {
    "max_split_size_mb": (1, 13), "roundup_power2_divisions": (1, 13),
    "garbage_collection_threshold": (1, 13), "roundup_bypass_threshold_mb": (1, 13),
    "expandable_segments": (2, 1), "release_lock_on_cudamalloc": (2, 2),
    "pinned_use_cuda_host_register": (2, 2), "pinned_num_register_threads": (2, 2),
    "max_non_split_rounding_mb": (2, 6),
}
KEYS_UNTIL = {"roundup_bypass_threshold_mb": (1, 13)}
KEYS = sorted(k for k, since in KEYS_SINCE.items()
              if since <= VERSION.key <= KEYS_UNTIL.get(k, (99, 0)))


def torch_accepts(text: str) -> bool:
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


def test_never_accept_what_this_releases_cuda_parser_rejects():
    rng = random.Random(1913)
    cases = [make_case(rng, KEYS) for _ in range(6_000)]
    false_accepts = []
    counts = {"torch_accepts": 0, "we_accept": 0}
    for case in cases:
        theirs, ours = torch_accepts(case.text), ours_accepts(case.text)
        counts["torch_accepts"] += theirs
        counts["we_accept"] += ours
        if ours and not theirs:
            false_accepts.append(case.text)
    print(f"\n{len(cases)} strings against torch {torch.__version__}'s CUDA parser, keys {KEYS}: {counts}")
    assert counts["torch_accepts"] > 500 and counts["we_accept"] > 300  # both sides exercised
    assert false_accepts[:20] == []
    assert not torch.cuda.is_initialized()  # asking the parser initialised nothing


@pytest.mark.parametrize(("text", "accepted"), [
    ("roundup_power2_divisions:4", True),
    ("max_split_size_mb:20", False),  # must be > 20 up to 2.9
    ("max_split_size_mb:21", True),
])
def test_per_version_rules_agree_with_the_release(text, accepted):
    assert torch_accepts(text) is accepted
    assert ours_accepts(text) is accepted


def test_the_list_form_of_roundup_is_taken_exactly_where_the_release_takes_it():
    text = "roundup_power2_divisions:[256:4,>:8]"
    assert ours_accepts(text) is torch_accepts(text)
    assert torch_accepts("expandable_segments:True") is ("expandable_segments" in KEYS)
    assert ours_accepts("expandable_segments:True") is ("expandable_segments" in KEYS)
