"""Which variable torch reads, per release, and what we report about the current environment."""

from __future__ import annotations

import pytest

from allocconf_widget.core.config.envvars import (
    ALLOC_VAR,
    CUDA_VAR,
    HIP_VAR,
    check_environment,
    preferred_variable,
    read_order,
    snippets,
    variable_to_write,
)
from allocconf_widget.core.versions import parse_version

V = parse_version


@pytest.mark.parametrize(
    ("version", "device", "generic"),
    [
        ("2.7", (CUDA_VAR,), (CUDA_VAR,)),
        ("2.8", (CUDA_VAR,), (CUDA_VAR,)),
        ("2.8.0+rocm6.2", (CUDA_VAR, HIP_VAR), (CUDA_VAR, HIP_VAR)),
        ("2.9", (CUDA_VAR,), (CUDA_VAR,)),
        ("2.11", (CUDA_VAR, ALLOC_VAR), (CUDA_VAR, HIP_VAR, ALLOC_VAR)),
        ("2.11.0+rocm7.0", (CUDA_VAR, HIP_VAR, ALLOC_VAR), (CUDA_VAR, HIP_VAR, ALLOC_VAR)),
    ],
)
def test_read_order_per_release(version, device, generic):
    order = read_order(V(version))
    assert order.device == device
    assert order.generic == generic


def test_new_name_on_2_9_is_reported_as_silently_ignored():
    report = check_environment({ALLOC_VAR: "expandable_segments:True"}, V("2.9"))
    assert report.effective_text is None
    assert [p.code for p in report.problems] == ["ignored"]
    assert "183387" in report.problems[0].message
    # and the fix: write the old name
    assert variable_to_write(V("2.9"), {ALLOC_VAR: "expandable_segments:True"}) == CUDA_VAR


def test_empty_cuda_variable_shadows_the_new_name_on_2_11():
    # measured on an H200 / torch 2.11: PYTORCH_CUDA_ALLOC_CONF="" hid PYTORCH_ALLOC_CONF
    env = {CUDA_VAR: "", ALLOC_VAR: "expandable_segments:True"}
    report = check_environment(env, V("2.11"))
    assert report.device_from == CUDA_VAR
    assert report.effective_text == ""
    assert any(p.code == "shadowed" and "even though it is empty" in p.message for p in report.problems)
    assert variable_to_write(V("2.11"), env) == CUDA_VAR


def test_split_read_on_cuda_build_with_hip_and_alloc_set():
    env = {HIP_VAR: "max_split_size_mb:256", ALLOC_VAR: "release_lock_on_cudamalloc:True"}
    report = check_environment(env, V("2.11"))
    assert report.generic_from == HIP_VAR and report.device_from == ALLOC_VAR
    assert any(p.code == "split" for p in report.problems)
    assert variable_to_write(V("2.11"), env) == CUDA_VAR


def test_invalid_value_already_in_the_environment_is_reported():
    report = check_environment({CUDA_VAR: "max_split_size_mb=128"}, V("2.11"))
    assert [p.code for p in report.problems] == ["invalid"]
    assert "max_split_size_mb:128" in report.problems[0].message


def test_preferred_name_follows_the_release_and_the_winning_variable_is_reused():
    assert preferred_variable(V("2.9")) == CUDA_VAR
    assert preferred_variable(V("2.11")) == ALLOC_VAR
    assert variable_to_write(V("2.11"), {}) == ALLOC_VAR
    assert variable_to_write(V("2.11"), {ALLOC_VAR: "x"}) == ALLOC_VAR
    assert variable_to_write(V("2.11"), {CUDA_VAR: "x"}) == CUDA_VAR


def test_snippets_set_and_unset():
    snip = snippets("expandable_segments:True", ALLOC_VAR)
    assert snip["magic"] == "%env PYTORCH_ALLOC_CONF=expandable_segments:True"
    assert snip["shell"] == "export PYTORCH_ALLOC_CONF='expandable_segments:True'"
    assert snip["python"].index("os.environ") < snip["python"].index("import torch")
    empty = snippets("", CUDA_VAR)
    # an empty variable still counts as set (and shadows others): unset it instead
    assert "pop" in empty["magic"] and empty["shell"] == f"unset {CUDA_VAR}"
