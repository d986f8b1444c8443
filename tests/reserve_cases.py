"""torch 2.15's expandable-segment reserve grammar, as a table of values and what torch does.

Built from torch 2.15's ``c10/cuda/CUDAAllocatorConfig.cpp``:

* ``parseReserveSpec(token)``: a trailing ``G``/``g`` makes the number GiB, else a fraction of
  device memory; the number is read with ``std::istringstream >> double`` in the classic
  locale and is valid when ``!num.empty() && !iss.fail() && iss.eof() && std::isfinite(value)
  && value > 0.0``. Anything else: ``TORCH_WARN("Ignoring invalid expandable-segment reserve
  value '…' …; using default.")`` and the default stays.
* ``parseExpandableSegmentsReserveByClass``: ``[`` then, until ``]``, ``name : spec`` with an
  optional ``,`` after each; any token is a name; a bad spec skips that entry with the warning.
  A value that is not a list runs the tokenizer off its end (an internal assert).

``ACCEPTED`` holds what torch takes; ``IGNORED`` what it warns about and ignores, and
``BROKEN`` what makes it fail. ``tests/unit/test_torch_oracle_reserve.py`` asks a torch
2.15 CUDA build the same questions.
"""

from __future__ import annotations

RESERVE = "expandable_segments_reserve"
BY_CLASS = "expandable_segments_reserve_by_class"

#: (value, canonical text we keep): accepted by torch 2.15
ACCEPTED_RESERVES = [
    ("0.5", "0.5"), ("1.1", "1.1"), ("3", "3"), ("1.5G", "1.5G"), ("40G", "40G"),
    ("40g", "40G"), ("1.5g", "1.5G"), (".5", "0.5"), ("5.", "5"), ("+2G", "2G"),
    ("1e2G", "100G"), ("1E-3", "0.001"), ("0.000001", "1e-06"), ("1e-310", "1e-310"),
    ("007", "7"), ("0.5e1G", "5G"),
]
#: values torch 2.15 warns about and ignores (its default reserve stays)
IGNORED_RESERVES = [
    "abc", "-1", "-0.5", "0", "0.0", "0G", "-0", "G", "g", "1e400", "1e400G", "inf", "nan",
    "0x10", "1e-400", "1_0", "1.5GiB", "40GB", "1.2.3", "1e", "1e+", "+", ".", "e5", "5G5",
    "\uff11", "1.5GG",
]

#: (value, canonical text): by-class lists torch 2.15 takes whole
ACCEPTED_CLASS_LISTS = [
    ("[serve-v2:0.5]", "[serve-v2:0.5]"),
    ("[weights:0.25,kv:8g]", "[weights:0.25,kv:8G]"),
    ("[kv.cache:1.5G]", "[kv.cache:1.5G]"),
    ("[1st:1.1]", "[1st:1.1]"),
    ("[a:0.5,]", "[a:0.5]"),
    ("[]", "[]"),
]
#: by-class lists with an entry torch 2.15 skips with the warning
IGNORED_CLASS_LISTS = ["[a:bad]", "[a:0.5,b:0]", "[a:-1G]"]
#: by-class values that make torch 2.15's parser fail
BROKEN_CLASS_VALUES = ["0.5", "[a0.5]", "[:0.5]"]
