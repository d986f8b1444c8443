"""OOM message parsing, the memory breakdown, and advice grounded in the numbers."""

from __future__ import annotations

import pytest

from allocconf_widget.core.memory.oom import (
    Advice,
    OomInfo,
    advise,
    breakdown_from_oom,
    breakdown_from_stats,
    parse_oom_message,
)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Observed on torch 2.11 / H200 (docs/internals/allocator_facts.md §9), wrapped as a terminal shows it.
MSG_22 = """torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.
GPU 0 has a total capacity of 139.80 GiB of which
19.29 GiB is free. Including non-PyTorch memory, this process has 120.51 GiB memory in use. Of the
allocated memory 120.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but
unallocated. If reserved but unallocated memory is large try setting
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for
Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"""

# Real-world shapes of the message (public issue reports).
MSG_FRAGMENTED = (
    "CUDA out of memory. Tried to allocate 472.00 MiB. GPU 0 has a total capacity of 23.70 GiB "
    "of which 114.56 MiB is free. Including non-PyTorch memory, this process has 23.58 GiB memory "
    "in use. Of the allocated memory 18.26 GiB is allocated by PyTorch, and 3.69 GiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
MSG_OTHER_PROCESS = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.98 GiB.\n"
    "GPU 0 has a total capacity of 15.56 GiB of which 1.37 GiB is free.\n"
    "Process 6680 has 1.81 GiB memory in use.\n"
    "Including non-PyTorch memory, this process has 11.21 GiB memory in use.\n"
    "Of the allocated memory 9.46 GiB is allocated by PyTorch, and 1.51 GiB is reserved by "
    "PyTorch but unallocated."
)
MSG_CONTAINER = (  # NVML shows host pids: this process appears as "Process N"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 14.75 GiB of which 3.06 MiB is free. Process 22744 has 14.74 GiB memory in use. "
    "Of the allocated memory 14.52 GiB is allocated by PyTorch, and 89.04 MiB is reserved by "
    "PyTorch but unallocated."
)
MSG_21 = (
    "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacty of 23.69 GiB of "
    "which 7.11 GiB is free. Process 2006998 has 256.00 MiB memory in use. Including non-PyTorch "
    "memory, this process has 16.31 GiB memory in use. Of the allocated memory 16.01 GiB is "
    "allocated by PyTorch, and 7.47 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See "
    "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
MSG_20 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 74.00 MiB (GPU 0; 10.76 GiB total "
    "capacity; 9.47 GiB already allocated; 62.44 MiB free; 9.83 GiB reserved in total by "
    "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
MSG_20_ALLOWED = (
    "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 1; 1.95 GiB total capacity; "
    "512.00 KiB already allocated; 1.80 GiB free; 1.00 MiB allowed; 2.00 MiB reserved in total "
    "by PyTorch)"
)
MSG_ALLOWED = (  # fraction limit, as observed on 2.11 (docs/internals/allocator_facts.md §9)
    "CUDA out of memory. Tried to allocate 200.00 MiB. GPU 0 has a total capacity of 139.80 GiB "
    "of which 138.00 GiB is free. Including non-PyTorch memory, this process has 518.00 MiB "
    "memory in use. 143.16 MiB allowed; Of the allocated memory 0 bytes is allocated by PyTorch, "
    "and 0 bytes is reserved by PyTorch but unallocated."
)
MSG_PRIVATE_POOLS = (
    "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 3 has a total capacity of 79.15 GiB of "
    "which 512.00 MiB is free. Including non-PyTorch memory, this process has 78.64 GiB memory in "
    "use. Of the allocated memory 70.00 GiB is allocated by PyTorch, with 6.50 GiB allocated in "
    "private pools (e.g., CUDA Graphs), and 8.00 GiB is reserved by PyTorch but unallocated."
)


def _g(x: float) -> int:
    return round(x * GIB)


def _m(x: float) -> int:
    return round(x * MIB)


# ----------------------------------------------------------------- parsing


def test_parses_the_2_2_message_into_bytes() -> None:
    info = parse_oom_message(MSG_22)
    assert info == OomInfo(
        tried_to_allocate=20 * GIB,
        total_capacity=_g(139.80),
        free=_g(19.29),
        process_in_use=_g(120.51),
        allocated_by_pytorch=120 * GIB,
        reserved_unallocated=0,
        device=0,
        message_format="2.2+",
        suggests_expandable=True,
    )


def test_line_wrapping_does_not_change_the_result() -> None:
    assert parse_oom_message(MSG_22) == parse_oom_message(" ".join(MSG_22.split()))
    assert parse_oom_message(MSG_OTHER_PROCESS) == parse_oom_message(
        MSG_OTHER_PROCESS.replace("\n", " ")
    )


def test_fraction_limit_variant() -> None:
    info = parse_oom_message(MSG_ALLOWED)
    assert info is not None
    assert info.allowed == _m(143.16)
    assert info.process_in_use == _m(518)
    assert info.allocated_by_pytorch == 0


def test_private_pools_variant() -> None:
    info = parse_oom_message(MSG_PRIVATE_POOLS)
    assert info is not None
    assert (info.device, info.private_pools) == (3, _g(6.5))
    assert info.allocated_by_pytorch == 70 * GIB
    assert info.reserved_unallocated == 8 * GIB


def test_2_1_message_with_typo_and_process_list() -> None:
    info = parse_oom_message(MSG_21)
    assert info is not None
    assert info.total_capacity == _g(23.69)
    assert info.other_processes == ((2006998, 256 * MIB),)
    assert info.message_format == "2.1"
    assert not info.suggests_expandable


def test_2_0_message_derives_reserved_but_unallocated() -> None:
    info = parse_oom_message(MSG_20)
    assert info is not None
    assert info.message_format == "2.0"
    assert info.process_in_use is None  # never printed by 2.0
    assert info.allocated_by_pytorch == _g(9.47)
    assert info.reserved_unallocated == _g(9.83) - _g(9.47)
    assert info.free == _m(62.44)


def test_2_0_message_with_fraction_limit_and_small_units() -> None:
    info = parse_oom_message(MSG_20_ALLOWED)
    assert info is not None
    assert (info.device, info.allocated_by_pytorch, info.allowed) == (1, 512 * KIB, MIB)
    assert info.reserved_unallocated == 2 * MIB - 512 * KIB


@pytest.mark.parametrize(
    "text",
    [
        "",
        "RuntimeError: CUDA error: device-side assert triggered",
        "CUDA out of memory.",  # no numbers to work with
        "CUDA out of memory. Tried to allocate 2.00 MiB. something else entirely",
    ],
)
def test_text_that_is_not_a_complete_oom_message_gives_none(text: str) -> None:
    assert parse_oom_message(text) is None


def test_container_single_process_line_is_taken_as_this_process() -> None:
    info = parse_oom_message(MSG_CONTAINER)
    assert info is not None and info.process_in_use is None
    assert info.this_process == _g(14.74)
    assert info.other_processes_bytes is not None and info.other_processes_bytes < 32 * MIB


# ----------------------------------------------------------------- breakdown


@pytest.mark.parametrize(
    "message", [MSG_22, MSG_FRAGMENTED, MSG_OTHER_PROCESS, MSG_CONTAINER, MSG_20, MSG_ALLOWED]
)
def test_breakdown_parts_add_up_to_the_card(message: str) -> None:
    info = parse_oom_message(message)
    assert info is not None
    parts = breakdown_from_oom(info).parts()
    # the message prints 2 decimals per figure: allow ~5 MiB per GiB-sized number
    assert abs(sum(size for _label, size in parts) - info.total_capacity) <= 40 * MIB
    assert all(size > 0 for _label, size in parts)


def test_breakdown_separates_other_processes_when_nvml_reported_them() -> None:
    info = parse_oom_message(MSG_OTHER_PROCESS)
    assert info is not None
    b = breakdown_from_oom(info)
    assert b.allocated == _g(9.46) and b.reserved_unallocated == _g(1.51)
    # 15.56 total - 1.37 free - 11.21 this process = 2.98 GiB in other processes
    assert b.other_processes == pytest.approx(_g(2.98), abs=16 * MIB)
    assert b.non_pytorch == pytest.approx(_g(11.21 - 9.46 - 1.51), abs=16 * MIB)


def test_breakdown_from_2_0_message_cannot_split_outside_memory() -> None:
    info = parse_oom_message(MSG_20)
    assert info is not None
    b = breakdown_from_oom(info)
    assert b.non_pytorch is None and b.other_processes is None
    assert b.unknown == pytest.approx(_g(10.76) - _m(62.44) - _g(9.83), abs=16 * MIB)


def test_breakdown_from_stats_with_and_without_device_info() -> None:
    stats = {"allocated_bytes.all.current": 6 * GIB, "reserved_bytes.all.current": 8 * GIB}
    full = breakdown_from_stats(stats, 40 * GIB, device_free=20 * GIB, process_in_use=10 * GIB)
    assert (full.allocated, full.reserved_unallocated) == (6 * GIB, 2 * GIB)
    assert (full.non_pytorch, full.other_processes, full.free) == (2 * GIB, 10 * GIB, 20 * GIB)
    assert sum(size for _l, size in full.parts()) == 40 * GIB

    no_nvml = breakdown_from_stats(stats, 40 * GIB, device_free=20 * GIB)
    assert no_nvml.non_pytorch is None and no_nvml.unknown == 12 * GIB

    nothing = breakdown_from_stats(stats, 40 * GIB)
    assert nothing.free is None and nothing.unknown == 32 * GIB


def test_breakdown_from_empty_stats_means_pytorch_holds_nothing() -> None:
    b = breakdown_from_stats({}, 16 * GIB, device_free=15 * GIB)
    assert (b.allocated, b.reserved_unallocated, b.unknown) == (0, 0, GIB)


# ----------------------------------------------------------------- advice


def _advise(message: str, settings: dict[str, object] | None = None,
            version: tuple[int, int] = (2, 5)) -> list[Advice]:
    info = parse_oom_message(message)
    assert info is not None
    return advise(info, settings or {}, version)


def _rules(advice: list[Advice]) -> list[str]:
    return [a.rule for a in advice]


def _conf_changes(advice: list[Advice]) -> list[str]:
    return [a.conf_change for a in advice if a.conf_change is not None]


def test_fragmentation_with_expandable_off_suggests_expandable_segments() -> None:
    advice = _advise(MSG_FRAGMENTED, {"expandable_segments": False})
    assert _conf_changes(advice) == ["expandable_segments:True"]
    (tip,) = [a for a in advice if a.rule == "expandable_segments"]
    assert "3.69 GiB" in tip.reason and "16%" in tip.reason  # 3.69 of 23.58 GiB in use


@pytest.mark.parametrize("value", [True, "True", "true"])
def test_never_suggests_expandable_segments_when_already_on(value: object) -> None:
    advice = _advise(MSG_FRAGMENTED, {"expandable_segments": value})
    assert "expandable_segments:True" not in _conf_changes(advice)
    assert "expandable_already_on" in _rules(advice)
    (note,) = [a for a in advice if a.rule == "expandable_already_on"]
    assert "173049" in note.reason and not note.changes_settings


def test_expandable_segments_need_torch_2_1() -> None:
    advice = _advise(MSG_FRAGMENTED, {}, version=(2, 0))
    assert _conf_changes(advice) == []
    assert "upgrade_for_expandable" in _rules(advice)


@pytest.mark.parametrize(
    "settings", [{"max_split_size_mb": 128}, {"max_split_size": 128 * MIB}, {"max_split_size": "134217728"}]
)
def test_max_split_size_with_large_cache_is_suggested_for_removal(settings: dict[str, object]) -> None:
    advice = _advise(MSG_FRAGMENTED, settings)
    (remove,) = [a for a in advice if a.rule == "remove_max_split_size"]
    assert remove.unset == ("max_split_size_mb",) and remove.changes_settings
    assert "3.69 GiB" in remove.reason
    # removal comes before adding expandable segments
    assert _rules(advice).index("remove_max_split_size") < _rules(advice).index(
        "expandable_segments")


def test_max_split_size_with_expandable_on_cites_unbounded_growth() -> None:
    advice = _advise(MSG_FRAGMENTED, {"max_split_size_mb": 256, "expandable_segments": True})
    (remove,) = [a for a in advice if a.rule == "remove_max_split_size"]
    assert "123548" in remove.reason


@pytest.mark.parametrize("value", [-1, None, (1 << 64) - 1])
def test_unlimited_max_split_size_is_not_treated_as_set(value: object) -> None:
    advice = _advise(MSG_FRAGMENTED, {"max_split_size": value})
    assert "remove_max_split_size" not in _rules(advice)


def test_max_split_size_is_left_alone_when_the_cache_is_small() -> None:
    advice = _advise(MSG_CONTAINER, {"max_split_size_mb": 128})
    assert "remove_max_split_size" not in _rules(advice)


def test_memory_genuinely_allocated_means_no_allocator_setting_helps() -> None:
    # 14.52 GiB allocated of 14.75 GiB, only 89 MiB cached
    advice = _advise(MSG_CONTAINER)
    assert _rules(advice) == ["no_allocator_fix"]
    assert not any(a.changes_settings for a in advice)
    reason = advice[0].reason
    assert "89.04 MiB" in reason and "smaller batch" in reason and "checkpointing" in reason


def test_request_larger_than_free_plus_cache_means_no_allocator_setting_helps() -> None:
    # 20 GiB requested, 19.29 GiB free and nothing cached: packing cannot make room
    advice = _advise(MSG_22)
    assert _rules(advice)[0] == "no_allocator_fix"
    assert "20.00 GiB" in advice[0].reason and "19.29 GiB" in advice[0].reason
    assert _conf_changes(advice) == []


def test_large_cache_that_still_could_not_fit_the_request_says_both() -> None:
    msg = MSG_FRAGMENTED.replace("Tried to allocate 472.00 MiB", "Tried to allocate 6.00 GiB")
    advice = _advise(msg, {"expandable_segments": False})
    assert _rules(advice)[0] == "no_allocator_fix"
    (tip,) = [a for a in advice if a.rule == "expandable_segments"]
    assert "would not have made this request fit" in tip.reason


def test_other_processes_on_the_gpu_are_named() -> None:
    advice = _advise(MSG_OTHER_PROCESS, {"expandable_segments": False})
    (others,) = [a for a in advice if a.rule == "other_processes"]
    assert "process 6680" in others.reason and "2.98 GiB" in others.reason
    assert "expandable_segments:True" in _conf_changes(advice)  # 1.51 GiB cached, 13%


def test_free_memory_missing_without_process_lines_points_at_other_processes() -> None:
    msg = (
        "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
        "of which 1.00 GiB is free. Including non-PyTorch memory, this process has 30.00 GiB "
        "memory in use. Of the allocated memory 29.00 GiB is allocated by PyTorch, and 300.00 MiB "
        "is reserved by PyTorch but unallocated."
    )
    advice = _advise(msg)
    assert "other_processes" in _rules(advice)
    (no_fix,) = [a for a in advice if a.rule == "no_allocator_fix"]
    assert "outside PyTorch" in no_fix.reason  # the remedy points at the other memory first


def test_large_non_pytorch_memory_in_this_process_is_explained() -> None:
    msg = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.68 GiB "
        "of which 500.00 MiB is free. Including non-PyTorch memory, this process has 23.18 GiB "
        "memory in use. Of the allocated memory 18.00 GiB is allocated by PyTorch, and 200.00 MiB "
        "is reserved by PyTorch but unallocated."
    )
    advice = _advise(msg)
    (outside,) = [a for a in advice if a.rule == "non_pytorch_memory"]
    assert "4.98 GiB" in outside.reason  # 23.18 - 18.00 - 0.20
    assert "other_processes" not in _rules(advice)


def test_typical_cuda_context_is_not_flagged() -> None:
    assert "non_pytorch_memory" not in _rules(_advise(MSG_22))  # 0.51 GiB outside PyTorch


def test_binding_fraction_limit_is_the_first_thing_said() -> None:
    advice = _advise(MSG_ALLOWED)
    assert _rules(advice)[0] == "fraction_limit"
    assert "143.16 MiB" in advice[0].reason and "set_per_process_memory_fraction" in advice[0].reason
    assert "no_allocator_fix" not in _rules(advice)


def test_fraction_limit_in_2_0_format_is_recognised() -> None:
    assert _rules(_advise(MSG_20_ALLOWED))[0] == "fraction_limit"


def test_2_0_message_with_outside_memory_unattributed() -> None:
    msg = MSG_20.replace("62.44 MiB free", "62.44 MiB free").replace(
        "10.76 GiB total", "14.76 GiB total")
    advice = _advise(msg, version=(2, 0))
    assert "memory_outside_pytorch" in _rules(advice)


def test_cuda_malloc_async_backend_gets_no_native_allocator_advice() -> None:
    advice = _advise(MSG_FRAGMENTED, {"backend": "cudaMallocAsync", "max_split_size_mb": 128})
    assert not any(a.changes_settings for a in advice)
