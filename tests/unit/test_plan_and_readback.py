"""Apply plans per runtime phase, the setter string, and read-back diagnosis (pure logic).

The read-back cases use real ``allocator_settings`` dicts recorded on an H200
with torch 2.11 (benchmarks/data/probe_runtime_h200_torch2.11.jsonl).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.config.envvars import check_environment
from allocconf_widget.core.config.plan import Action, RuntimeFacts, plan_apply, setter_string
from allocconf_widget.core.config.readback import compare
from allocconf_widget.core.versions import parse_version

V211 = parse_version("2.11")
PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "probe_runtime_h200_torch2.11.jsonl"


def c(text: str, version: str = "2.11"):
    return parse_conf(text, version, warn=False)


def facts(**kw) -> RuntimeFacts:
    base: dict[str, Any] = {"version": V211, "torch_imported": True, "cuda_built": True, "live": False,
            "can_set_live": True, "load_time_backend": "native"}
    base.update(kw)
    return RuntimeFacts(**base)


def actions(current: str, requested: str, **kw) -> dict[str, Action]:
    return {p.option: p.action for p in plan_apply(c(current), c(requested), facts(**kw))}


def test_before_import_everything_goes_through_the_environment():
    plan = actions("", "backend:cudaMallocAsync,expandable_segments:True", torch_imported=False)
    assert plan == {"backend": Action.AT_IMPORT, "expandable_segments": Action.AT_FIRST_CUDA_USE}


def test_after_import_backend_needs_restart_but_the_rest_applies_now():
    plan = actions("", "backend:cudaMallocAsync,expandable_segments:True")
    assert plan == {"backend": Action.NEEDS_RESTART, "expandable_segments": Action.APPLIED_NOW}


def test_backend_equal_to_load_time_is_not_a_restart():
    assert actions("", "backend:native") == {"backend": Action.UNCHANGED}


def test_option_unknown_to_the_installed_torch_is_not_supported():
    plan = plan_apply(c(""), c("throw_on_cudamalloc_oom:True", "2.12"), facts())
    assert [(p.option, p.action) for p in plan] == [("throw_on_cudamalloc_oom", Action.NOT_SUPPORTED)]
    assert "2.12+" in plan[0].detail


def test_without_runtime_setter_live_changes_need_restart():
    assert actions("", "expandable_segments:True", live=True, can_set_live=False) == {
        "expandable_segments": Action.NEEDS_RESTART}
    assert actions("", "expandable_segments:True", live=False, can_set_live=False) == {
        "expandable_segments": Action.AT_FIRST_CUDA_USE}


def test_unsetting_an_option_the_setter_cannot_restore_needs_restart():
    assert actions("pinned_reserve_segment_size_mb:64", "") == {
        "pinned_reserve_segment_size_mb": Action.NEEDS_RESTART}


def test_cpu_only_torch_says_no_effect():
    assert actions("", "expandable_segments:True", cuda_built=False) == {
        "expandable_segments": Action.NO_CUDA}


def test_setter_string_is_complete_and_restores_defaults_it_would_keep():
    # the generic parser resets max_split/roundup/gc when omitted, but not expandable_segments
    text = setter_string(c("expandable_segments:True,max_split_size_mb:256"),
                         c("garbage_collection_threshold:0.6"), facts())
    assert text == "garbage_collection_threshold:0.6,expandable_segments:False"
    # a one-option change still sends every option (the reset pitfall)
    text = setter_string(c("max_split_size_mb:256,garbage_collection_threshold:0.6"),
                         c("max_split_size_mb:256,garbage_collection_threshold:0.6,expandable_segments:True"),
                         facts())
    assert c(text) == c("expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.6")
    assert "backend" not in setter_string(c(""), c("backend:native,expandable_segments:True"), facts())


def _probe(scenario: str) -> dict:
    for line in PROBE.read_text().splitlines():
        row = json.loads(line)
        if row["scenario"] == scenario:
            return row["result"]
    raise KeyError(scenario)


def test_readback_catches_the_reset_pitfall_on_real_h200_settings():
    # the user asked for all three; a naive one-key setter call left only expandable_segments
    requested = c("max_split_size_mb:256,garbage_collection_threshold:0.6,expandable_segments:True")
    settings = _probe("setter_reset_pitfall")["after_one_key"]
    result = compare(requested, settings, settings["PYTORCH_CUDA_ALLOC_CONF"])
    assert {r.option for r in result.mismatches} == {"max_split_size_mb", "garbage_collection_threshold"}
    assert any("changed after they were applied" in cause for cause in result.causes)
    good = _probe("setter_reset_pitfall")["after_full"]
    assert compare(requested, good, good["PYTORCH_CUDA_ALLOC_CONF"]).ok


def test_readback_explains_a_variable_set_too_late():
    # measured: env set after memory_snapshot() froze the config → torch kept ''
    env = check_environment({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, V211)
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False, "max_split_size": -1}
    result = compare(c("expandable_segments:True"), settings, "", env)
    assert [r.option for r in result.mismatches] == ["expandable_segments"]
    assert "before the variable got its value" in result.causes[0]


def test_readback_explains_a_shadowing_variable():
    env = check_environment({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
                             "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, V211)
    settings = _probe("both_vars_cuda_wins")
    assert settings["expandable_in_settings"] is False
    result = compare(c("expandable_segments:True"), {"expandable_segments": False},
                     "expandable_segments:False", env)
    assert not result.ok
    assert any("PYTORCH_ALLOC_CONF is not read" in cause for cause in result.causes)


@pytest.mark.parametrize("stats_max_split", [-1, 128 << 20])
def test_stats_max_split_lag_is_explained_not_flagged(stats_max_split):
    settings = {"max_split_size": 256 << 20}
    result = compare(c("max_split_size_mb:256"), settings, "max_split_size_mb:256",
                     stats_max_split=stats_max_split)
    assert result.ok
    assert "memory_stats()['max_split_size'] still shows" in result.rows[0].note


def test_roundup_slots_are_compared_per_release():
    settings = {"roundup_power2_divisions": {str(1 << i): (1 if i <= 8 else 2 if i == 9 else 8)
                                             for i in range(16)}}
    assert compare(c("roundup_power2_divisions:[256:1,512:2,>:8]"), settings, None).ok
