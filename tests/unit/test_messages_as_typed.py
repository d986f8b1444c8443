"""A message about a value quotes the setting as the user typed it; its fix is torch's form.

``name:value`` in a configuration string (``allocconf check``, ``%allocconf set "a:1,b:2"``,
the magic's ``name:value`` item) is quoted with ``:``; the magic's ``name=value`` with ``=``.
The fix always says ``name:value``, the only form torch reads.
"""

from __future__ import annotations

import pytest

from allocconf_widget import AllocConfError, parse_conf

CASES = [  # (option, bad value, what the message says about it)
    ("max_split_size_mb", "-5", "is negative"),
    ("max_split_size_mb", "12.5", "is not a whole number"),
    ("max_split_size_mb", "7", "is too small"),
    ("garbage_collection_threshold", "1.5", "is too large"),
    ("garbage_collection_threshold", "0.6x", "has trailing characters"),
    ("garbage_collection_threshold", "1e999", "is too large for a double"),
    ("roundup_power2_divisions", "3", "is not a power of two"),
    ("pinned_num_register_threads", "99999999999999999999999", "is too large"),
]


def error(text: str, version: str = "2.13") -> AllocConfError:
    with pytest.raises(AllocConfError) as info:
        parse_conf(text, version, warn=False)
    return info.value


@pytest.mark.parametrize(("name", "value", "says"), CASES)
def test_a_string_typed_with_colons_is_quoted_with_colons(name: str, value: str, says: str) -> None:
    problem = error(f"expandable_segments:True,{name}:{value}")
    assert f"{name}:{value} {says}" in problem.reason
    assert f"{name}={value}" not in str(problem)


@pytest.mark.parametrize(("name", "value", "says"), CASES)
def test_the_magics_equals_form_is_quoted_with_equals(name: str, value: str, says: str) -> None:
    base = parse_conf("", "2.13", warn=False)
    with pytest.raises(AllocConfError) as info:
        base.with_changes({name: value}, typed_with={name: "="})
    assert f"{name}={value} {says}" in info.value.reason
    with pytest.raises(AllocConfError) as info:
        base.with_changes({name: value}, typed_with={name: ":"})
    assert f"{name}:{value} {says}" in info.value.reason


def test_the_fix_is_always_torchs_form() -> None:
    base = parse_conf("", "2.13", warn=False)
    with pytest.raises(AllocConfError) as info:
        base.with_changes({"max_split_size_mb": "512.5"}, typed_with={"max_split_size_mb": "="})
    assert info.value.reason.startswith("max_split_size_mb=512.5 ")
    assert info.value.fix is not None and "max_split_size_mb:512" in info.value.fix


def test_each_of_several_problems_is_quoted_as_typed() -> None:
    base = parse_conf("", "2.13", warn=False)
    with pytest.raises(AllocConfError) as info:
        base.with_changes({"garbage_collection_threshold": "1.5", "max_split_size_mb": "7"},
                          typed_with={"garbage_collection_threshold": "=", "max_split_size_mb": ":"})
    assert "garbage_collection_threshold=1.5 is too large" in str(info.value)
    assert "max_split_size_mb:7 is too small" in str(info.value)
