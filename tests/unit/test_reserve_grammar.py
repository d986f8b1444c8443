"""The expandable-segment reserve options take exactly what torch 2.15 takes (tests/reserve_cases.py).

What torch takes, we take (in canonical text torch reads the same); what torch ignores with a
warning or fails on, we refuse, saying so.
"""

from __future__ import annotations

import pytest

from allocconf_widget import AllocConfError, parse_conf
from tests.reserve_cases import (
    ACCEPTED_CLASS_LISTS,
    ACCEPTED_RESERVES,
    BROKEN_CLASS_VALUES,
    BY_CLASS,
    IGNORED_CLASS_LISTS,
    IGNORED_RESERVES,
    RESERVE,
)


@pytest.mark.parametrize(("value", "canonical"), ACCEPTED_RESERVES)
def test_a_reserve_torch_takes_is_taken(value: str, canonical: str) -> None:
    conf = parse_conf(f"{RESERVE}:{value}", "2.15", warn=False)
    assert conf.to_string() == f"{RESERVE}:{canonical}"
    assert parse_conf(conf.to_string(), "2.15", warn=False) == conf  # the canonical text reads back


@pytest.mark.parametrize("value", IGNORED_RESERVES)
def test_a_reserve_torch_ignores_is_refused_with_its_warning(value: str) -> None:
    with pytest.raises(AllocConfError) as info:
        parse_conf(f"{RESERVE}:{value}", "2.15", warn=False)
    assert info.value.option == RESERVE
    assert "Ignoring invalid expandable-segment reserve value" in str(info.value)
    assert f"{RESERVE}:{value}" in str(info.value)  # quoted as typed, with ':'
    assert info.value.fix is not None and f"{RESERVE}:0.5" in info.value.fix


@pytest.mark.parametrize(("value", "canonical"), ACCEPTED_CLASS_LISTS)
def test_a_class_list_torch_takes_is_taken(value: str, canonical: str) -> None:
    conf = parse_conf(f"{BY_CLASS}:{value}", "2.15", warn=False)
    assert conf.to_string() == f"{BY_CLASS}:{canonical}"
    assert parse_conf(conf.to_string(), "2.15", warn=False) == conf


@pytest.mark.parametrize("value", IGNORED_CLASS_LISTS + BROKEN_CLASS_VALUES)
def test_a_class_list_torch_skips_or_fails_on_is_refused(value: str) -> None:
    with pytest.raises(AllocConfError) as info:
        parse_conf(f"{BY_CLASS}:{value}", "2.15", warn=False)
    assert info.value.option == BY_CLASS


def test_a_bad_class_reserve_names_its_class() -> None:
    with pytest.raises(AllocConfError, match=r"^class 'kv': expandable_segments_reserve_by_class:bad "
                       ) as info:
        parse_conf(f"{BY_CLASS}:[weights:0.5,kv:bad]", "2.15", warn=False)
    assert info.value.position == len(f"{BY_CLASS}:[weights:0.5,kv:")


def test_the_reserve_options_are_2_15_only() -> None:
    for text in (f"{RESERVE}:0.5", f"{BY_CLASS}:[a:0.5]"):
        with pytest.raises(AllocConfError, match=r"needs torch 2\.15"):
            parse_conf(text, "2.14", warn=False)
