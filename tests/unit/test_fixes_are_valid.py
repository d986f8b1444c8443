"""A fix we offer must itself be accepted (issue 24, items 13 and 14).

For every whole-number option and a handful of near-miss inputs, each ``name:value`` the
error's fix suggests parses cleanly for the same torch release. A per-band list typed without
its brackets is told to add them. ``allocconf options`` on the huge MiB bound:
tests/cli/test_fixes_are_valid.py.
"""

from __future__ import annotations

import re

import pytest

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.versions import parse_version

INTEGER_KINDS = {opt.Kind.SIZE_MB, opt.Kind.COUNT, opt.Kind.ROUNDUP}
NEAR_MISSES = ["1.5", "3.5", "5.5", "19.9", "300.5", "+8", "1e3", "-4"]


@pytest.mark.parametrize("release", ["2.4", "2.10", "2.13"])
@pytest.mark.parametrize("spec", [s for s in opt.OPTIONS if s.kind in INTEGER_KINDS], ids=lambda s: s.name)
def test_every_suggested_value_is_accepted(spec, release):
    version = parse_version(release)
    if version.schema_key < spec.since or (spec.until is not None and version.schema_key > spec.until):
        pytest.skip(f"{spec.name} is not in torch {release}")
    for typed in NEAR_MISSES:
        try:
            parse_conf(f"{spec.name}:{typed}", version, warn=False)
            continue
        except AllocConfError as exc:
            fix = exc.fix or ""
        for value in re.findall(rf"{spec.name}:(\S+?)[,.]?(?:\s|$)", fix):
            parse_conf(f"{spec.name}:{value}", version, warn=False)  # raises if the fix is invalid


def test_max_split_of_one_and_a_half_is_not_told_to_use_one():
    with pytest.raises(AllocConfError) as info:
        parse_conf("max_split_size_mb:1.5", "2.13", warn=False)
    assert info.value.reason.startswith("max_split_size_mb:1.5 ")  # quoted as typed
    assert "max_split_size_mb:1" not in (info.value.fix or "")
    assert "20 or more" in str(info.value)


def test_bands_without_brackets_are_told_to_wrap_them():
    with pytest.raises(AllocConfError) as info:
        parse_conf("roundup_power2_divisions:256:2,>:8,expandable_segments:True", "2.13", warn=False)
    assert "wrap the bands in [ ]" in str(info.value)
    assert "roundup_power2_divisions:[256:2,>:8]" in str(info.value)
    parse_conf("roundup_power2_divisions:[256:2,>:8]", "2.13", warn=False)  # and that fix is valid
