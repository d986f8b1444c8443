"""The configuration model: what users paste, what torch would do with it, what we say."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocconf_widget import AllocConfError, AllocConfWarning, parse_conf
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import AllocConf, RoundupDivisions
from allocconf_widget.core.versions import KNOWN_RELEASES, parse_version


def quiet(text: str, version: str = "2.11") -> AllocConf:
    return parse_conf(text, version, warn=False)


def error_of(text: str, version: str = "2.11") -> AllocConfError:
    with pytest.raises(AllocConfError) as info:
        quiet(text, version)
    return info.value


# ------------------------------------------------------------------ blog-post mistakes
@pytest.mark.parametrize(
    ("text", "option", "position", "fix_has"),
    [
        ("max_split_size_mb=128", "max_split_size_mb", 17, "max_split_size_mb:128"),
        ("expandable_segments:true", "expandable_segments", 20, "expandable_segments:True"),
        ("expandable_segments:1", "expandable_segments", 20, "expandable_segments:True"),
        ("max_split_mb:50", "max_split_mb", 0, "max_split_size_mb"),
        ("expandeable_segments:True", "expandeable_segments", 0, "expandable_segments"),
        ("garbage_collect_threshold:0.6", "garbage_collect_threshold", 0,
         "garbage_collection_threshold"),
        ("backend:cudaMalloc", "backend", 8, "backend:native"),
        ("Max_Split_Size_MB:100", "Max_Split_Size_MB", 0, "max_split_size_mb"),
    ],
)
def test_common_mistakes_name_the_option_position_and_fix(text, option, position, fix_has):
    err = error_of(text)
    assert err.option == option
    assert err.position == position
    assert fix_has in (err.fix or "")
    assert isinstance(err, ValueError)  # AllocConfError is a ValueError for callers


@pytest.mark.parametrize(
    ("text", "read_as"),
    [
        ("max_split_size_mb:-5", "unlimited"),  # stoull wraps negatives
        ("max_split_size_mb:1e3", "as 1"),  # trailing junk ignored by torch
        ("max_split_size_mb:12.5", "as 12"),
        ("garbage_collection_threshold:0.5x", "0.5"),
        ("max_split_size_mb:1 28", "'128'"),  # deleted space glues words
        ("expandable_segments:Tr ue", "'True'"),
    ],
)
def test_strings_torch_accepts_but_misreads_are_refused_with_the_reason(text, read_as):
    err = error_of(text)
    assert read_as in str(err)


def test_removed_option_says_when_it_existed_and_what_replaces_it():
    err = error_of("roundup_bypass_threshold_mb:128")
    assert "only in torch 1.13" in str(err)
    assert "roundup_power2_divisions" in (err.fix or "")
    # but 1.13 itself accepts it
    assert quiet("roundup_bypass_threshold_mb:128", "1.13").get("roundup_bypass_threshold_mb") == 128


def test_option_from_a_newer_release_says_which_release_has_it():
    err = error_of("large_segment_size_mb:32", "2.9")
    assert "needs torch 2.11 or newer" in str(err)


@pytest.mark.parametrize(
    ("version", "ok", "bad", "needs"),
    [
        ("2.9", "21", "20", "more than 20"),
        ("2.10", "20", "19", "at least 20"),
        ("2.11", "20", "19", "at least 20"),
    ],
)
def test_max_split_lower_bound_follows_each_release(version, ok, bad, needs):
    assert quiet(f"max_split_size_mb:{ok}", version).get("max_split_size_mb") == int(ok)
    assert needs in str(error_of(f"max_split_size_mb:{bad}", version))


def test_max_split_bound_follows_large_segment_size_from_the_same_string():
    # torch 2.11+ parses large_segment_size_mb first, whatever the order
    for text in ("large_segment_size_mb:64,max_split_size_mb:32",
                 "max_split_size_mb:32,large_segment_size_mb:64"):
        assert "at least 64" in str(error_of(text))
    assert quiet("max_split_size_mb:64,large_segment_size_mb:64").get("max_split_size_mb") == 64


def test_stoi_limit_of_the_old_parser():
    assert "cannot read numbers above 2147483647" in str(error_of("max_split_size_mb:2147483648", "2.9"))
    assert quiet("max_split_size_mb:2147483648", "2.11").get("max_split_size_mb") == 2147483648


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_string_is_the_default_configuration(text):
    conf = quiet(text)
    assert len(conf) == 0
    assert conf.to_string() == ""


def test_whitespace_between_tokens_is_fine_but_tabs_break_old_torch():
    assert quiet("expandable_segments : True ,\tmax_split_size_mb: 512").to_string() == (
        "expandable_segments:True,max_split_size_mb:512")
    err = error_of("expandable_segments:\tTrue", "2.9")
    assert "tab" in str(err)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("expandable_segments:True,", "trailing comma"),
        (",expandable_segments:True", "empty setting"),
        ("expandable_segments:True,,max_split_size_mb:512", "empty setting"),
        ("expandable_segments:True]", "unexpected ']'"),
        ("expandable_segments:True:False", "unexpected ':'"),
        ("max_split_size_mb", "expected ':'"),
        ("max_split_size_mb:", "no value"),
        ("roundup_power2_divisions:[256:1", "not closed"),
        ("roundup_power2_divisions:[]", "empty"),
        ("roundup_power2_divisions:[256:1,]", "malformed list"),
        ("expandable_segments:[True]", "single value"),
    ],
)
def test_structural_errors(text, expect):
    assert expect in str(error_of(text))


# ------------------------------------------------------------------ roundup_power2_divisions
def test_roundup_list_slots_differ_between_old_and_new_parser():
    conf = quiet("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    divisions = conf.get("roundup_power2_divisions")
    assert isinstance(divisions, RoundupDivisions)
    new = divisions.slots((2, 11))
    old = divisions.slots((2, 9))
    # slots: 0 = below 2 MiB ... 8 = 256 MiB, 9 = 512 MiB, 10 = 1 GiB
    assert new[:9] == (1,) * 9 and new[9] == 2 and new[10] == 4 and new[11:] == (8,) * 5
    assert old[10] == 8  # the 2.0–2.9 parser lets '>' overwrite the last band


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("roundup_power2_divisions:[512:1,256:2]", "must increase"),
        ("roundup_power2_divisions:[>:2]", "roundup_power2_divisions:2"),
        ("roundup_power2_divisions:[>:2,256:4]", "roundup_power2_divisions:2"),
        ("roundup_power2_divisions:[256:1,>:2,512:4]", "last entry"),
        ("roundup_power2_divisions:[65536:2]", "32768"),
        ("roundup_power2_divisions:[3:2]", "not a power of two"),
        ("roundup_power2_divisions:[256:3]", "not a power of two"),
        ("roundup_power2_divisions:0", "not a power of two"),
    ],
)
def test_roundup_mistakes(text, expect):
    assert expect in str(error_of(text))


def test_roundup_zero_division_needs_2_4():
    divisions = quiet("roundup_power2_divisions:[256:4,>:0]", "2.4").get("roundup_power2_divisions")
    assert divisions.bands[-1] == (">", 0)
    assert "2.4 or newer" in str(error_of("roundup_power2_divisions:[256:4,>:0]", "2.3"))


# ------------------------------------------------------------------ traps (warnings)
@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("max_split_size_mb:128,expandable_segments:True", "split-with-expandable"),
        ("garbage_collection_threshold:0.6", "gc-without-fraction"),
        ("max_split_size_mb:256,max_split_size_mb:512", "duplicate"),
        ("backend:cudaMallocAsync,roundup_power2_divisions:4", "native-only-under-async"),
        ("max_non_split_rounding_mb:256", "rounding-without-split"),
    ],
)
def test_traps_warn_but_do_not_reject(text, code):
    with pytest.warns(AllocConfWarning):
        conf = parse_conf(text, "2.11")
    assert code in [w.code for w in conf.warnings]


def test_gc_with_a_fraction_is_not_a_trap():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conf = parse_conf("garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", "2.11")
    assert conf.warnings == ()


def test_duplicate_keeps_the_last_value_like_torch():
    assert quiet("max_split_size_mb:256,max_split_size_mb:512").get("max_split_size_mb") == 512


def test_unknown_newer_torch_uses_newest_rules_with_a_warning():
    with pytest.warns(AllocConfWarning, match="newer than"):
        conf = parse_conf("expandable_segments_reserve:0.5", "2.16")
    assert conf.get("expandable_segments_reserve") == "0.5"


# ------------------------------------------------------------------ value semantics
def test_canonical_string_is_schema_ordered_and_normalised():
    conf = quiet("max_split_size_mb:0512 , garbage_collection_threshold:6e-1,"
                 "per_process_memory_fraction:.5,backend:native")
    assert conf.to_string() == ("backend:native,max_split_size_mb:512,"
                                "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5")


def test_merge_overrides_and_revalidates():
    base = quiet("expandable_segments:True,max_split_size_mb:64")
    merged = base.merge(quiet("max_split_size_mb:512"))
    assert merged.to_string() == "expandable_segments:True,max_split_size_mb:512"
    with pytest.raises(AllocConfError, match="at least 128"):
        base.merge(quiet("large_segment_size_mb:128"))  # now max_split 64 < 128


@pytest.mark.parametrize("changes", [
    {"max_split_size_mb": "128,backend:cudaMallocAsync"},
    {"max_split_size_mb": "128,expandable_segments:True"},
    {"garbage_collection_threshold": "0.6:0.7"},
    {"max_split_size_mb:128,backend": "cudaMallocAsync"},
], ids=["comma-backend", "comma-expandable", "colon", "spliced-name"])
def test_each_text_value_is_validated_on_its_own(changes):
    """A form's text value cannot splice another option in."""
    base = quiet("expandable_segments:False")
    with pytest.raises(AllocConfError):
        base.with_changes(changes)
    assert base.with_changes({"max_split_size_mb": "128"}).to_string() == (
        "expandable_segments:False,max_split_size_mb:128")


def test_a_configuration_moves_to_another_release_option_by_option():
    """The replay checks a kernel's settings for the trace's release without a string parse:
    what that release refuses is said by name, what it takes is the same configuration."""
    newer = parse_conf("throw_on_cudamalloc_oom:True,max_split_size_mb:256", "2.13", warn=False)
    with pytest.raises(AllocConfError, match="throw_on_cudamalloc_oom"):
        newer.for_release("2.11")
    kept = parse_conf("expandable_segments:True,max_split_size_mb:256", "2.13", warn=False)
    moved = kept.for_release("2.11")
    assert moved == kept and str(moved.torch_version).startswith("2.11")


def test_diff_lists_changed_options_only():
    before = quiet("expandable_segments:False,max_split_size_mb:256")
    after = quiet("expandable_segments:True,max_split_size_mb:256,roundup_power2_divisions:4")
    changes = {c.option: (c.before, c.after) for c in before.diff(after)}
    assert changes == {"expandable_segments": (False, True),
                       "roundup_power2_divisions": (None, RoundupDivisions(uniform=4))}


def test_with_changes_validates_and_without_unsets():
    conf = quiet("expandable_segments:True")
    with pytest.raises(AllocConfError):
        conf.with_changes({"max_split_size_mb": "8"})
    assert conf.with_changes({"max_split_size_mb": 512}).get("max_split_size_mb") == 512
    assert conf.without("expandable_segments").to_string() == ""


def test_rocm_spelling_is_an_alias():
    conf = quiet("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True")
    assert conf.get("release_lock_on_cudamalloc") is True
    assert conf.to_string() == "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True"


def test_hip_backend_only_on_rocm_builds():
    assert quiet("backend:hipMallocAsync", "2.11.0+rocm6.2").get("backend") == "hipMallocAsync"
    assert "unknown backend" in str(error_of("backend:hipMallocAsync", "2.11.0+cu130"))


def test_expandable_segments_reserve_forms():
    assert quiet("expandable_segments_reserve:40g", "2.15").get("expandable_segments_reserve") == "40G"
    assert quiet("expandable_segments_reserve:1.5", "2.15").get("expandable_segments_reserve") == "1.5"
    assert "neither a fraction" in str(error_of("expandable_segments_reserve:1.5GiB", "2.15"))
    conf = quiet("expandable_segments_reserve_by_class:[weights:0.25,kv:8G]", "2.15")
    assert conf.to_string() == "expandable_segments_reserve_by_class:[weights:0.25,kv:8G]"


def test_version_argument_forms_and_errors():
    assert quiet("expandable_segments:True", "2.11.0+cu130").torch_version == (2, 11)
    with pytest.raises(AllocConfError, match="older than"):
        parse_conf("", "1.12")
    with pytest.raises(AllocConfError, match="not a torch version"):
        parse_conf("", "eleven")


# ------------------------------------------------------------------ property: round trip
def _value_strategy(spec: opt.OptionSpec, version):
    bound = spec.bound_in(version)
    if spec.kind is opt.Kind.BOOL:
        return st.sampled_from(["True", "False"])
    if spec.kind is opt.Kind.BACKEND:
        return st.sampled_from(["native", "cudaMallocAsync"])
    if spec.kind is opt.Kind.FRACTION:
        low_open = bound is not None and not bound.low_inclusive
        high_open = bound is not None and not bound.high_inclusive
        return st.floats(0.0, 1.0, exclude_min=low_open, exclude_max=high_open,
                         allow_subnormal=False).map(repr)
    if spec.kind is opt.Kind.ROUNDUP:
        single = st.integers(0, 10).map(lambda e: str(1 << e))
        band = st.lists(st.integers(0, 15), min_size=1, max_size=5, unique=True).map(sorted)
        divs = st.sampled_from([1, 2, 4, 8] + ([0] if version >= (2, 4) else []))

        def as_list(data):
            bands, values, tail = data
            items = [f"{1 << b}:{v}" for b, v in zip(bands, values, strict=False)]
            return "[" + ",".join(items + ([f">:{tail}"] if tail is not None else [])) + "]"

        lists = st.tuples(band, st.lists(divs, min_size=5, max_size=5),
                          st.none() | divs).map(as_list)
        return single | lists if version >= (2, 0) else single
    if spec.kind is opt.Kind.COUNT:
        return st.sampled_from(["1", "2", "4", "64", "128"])
    if spec.kind is opt.Kind.RESERVE:
        return st.sampled_from(["0.5", "1.0", "40G", "8G"])
    if spec.kind is opt.Kind.RESERVE_BY_CLASS:
        return st.sampled_from(["[a:0.5]", "[kv:8G,w:0.25]"])
    if spec.name == "large_segment_size_mb":  # keep it below the 64 MiB floor used for the others
        return st.integers(11, 64).map(str)
    low = (0 if bound is None or isinstance(bound.low, str)
           else int(bound.low or 0) + (not bound.low_inclusive))
    low = max(low, 64) if isinstance(bound.low if bound else None, str) else low
    return st.integers(low, min(int(bound.high) if bound and bound.high else 1 << 20, 1 << 20)).map(str)


@st.composite
def confs(draw):
    version = parse_version(draw(st.sampled_from(KNOWN_RELEASES)))
    specs = list(opt.options_for(version))
    chosen = draw(st.lists(st.sampled_from(specs), unique_by=lambda s: s.name, max_size=6))
    items = [f"{spec.name}:{draw(_value_strategy(spec, version))}" for spec in chosen]
    return ",".join(items), version


@settings(max_examples=400, deadline=None)
@given(confs())
def test_round_trip_parse_to_string(case):
    text, version = case
    conf = parse_conf(text, version, warn=False)
    again = parse_conf(conf.to_string(), version, warn=False)
    assert again == conf
    assert again.to_string() == conf.to_string()
    assert conf.merge(conf) == conf
    assert conf.diff(again) == ()


def test_messages_never_carry_raw_control_characters_or_unbounded_text():
    from allocconf_widget import AllocConfError as Error

    for text in ("max_split_size_mb:12\x00", "expandable_segments:\x1b[31mTrue",
                 "garbage_collection_threshold:" + "9" * 50_000):
        with pytest.raises(Error) as caught:
            parse_conf(text, "2.13", warn=False)
        message = str(caught.value)
        assert message.isprintable() and len(message) < 5000, message[:200]


@pytest.mark.parametrize("word", ["unlimited", "None", "default"])
def test_a_word_for_the_default_says_to_leave_the_option_unset(word):
    """The panel shows "unlimited" for an unset max_split_size_mb; typing it back answered
    only "is not a number"."""
    with pytest.raises(AllocConfError, match=r"it means torch's default.*leave max_split_size_mb unset"):
        parse_conf(f"max_split_size_mb:{word}", torch_version="2.11")
