"""torch 2.15's out-of-memory message for a request larger than the expandable-segment reserve.

The sentence comes from ``DeviceCachingAllocator::malloc`` in torch 2.15's
c10/cuda/CUDACachingAllocator.cpp (its strings as libc10_cuda.so 2.15.0 holds them):
after "… is reserved by PyTorch but unallocated." it says
``This allocation exceeds the expandable-segment reserve of <reserve>`` +
(`` for this stream`` | `` for stream reserve class '<name>'``) +
``, and a single allocation cannot span expandable segments. Raise PYTORCH_CUDA_ALLOC_CONF
expandable_segments_reserve or expandable_segments_reserve_by_class (or unset it) so that a
segment is at least <size>.`` and leaves out the "try expandable_segments:True" hint. The GPU
has room: nothing about fragmentation or a full GPU applies.
"""

from __future__ import annotations

from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.memory.oom import advise, parse_oom_message

GIB = 1 << 30
_HEAD = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 28.00 GiB. GPU 0 has a "
         "total capacity of 139.80 GiB of which 120.12 GiB is free. Including non-PyTorch memory, "
         "this process has 19.16 GiB memory in use. Of the allocated memory 12.00 GiB is allocated "
         "by PyTorch, and 6.62 GiB is reserved by PyTorch but unallocated.")
_TAIL = (", and a single allocation cannot span expandable segments. Raise "
         "PYTORCH_CUDA_ALLOC_CONF expandable_segments_reserve or "
         "expandable_segments_reserve_by_class (or unset it) so that a segment is at least "
         "28.00 GiB.")
MSG_STREAM = (f"{_HEAD} This allocation exceeds the expandable-segment reserve of 6.99 GiB for "
              f"this stream{_TAIL}")
MSG_CLASS = (f"{_HEAD} This allocation exceeds the expandable-segment reserve of 6.99 GiB for "
             f"stream reserve class 'serve-v2'{_TAIL}")


def test_the_reserve_sentence_is_read() -> None:
    info = parse_oom_message(MSG_STREAM)
    assert info is not None and info.message_format == "2.15 reserve"
    assert info.segment_needed == 28 * GIB
    assert abs(info.segment_reserve - round(6.99 * GIB)) < GIB // 100
    assert info.reserve_class is None
    wrapped = parse_oom_message(MSG_CLASS.replace(" ", "\n", 9))  # as a terminal wraps it
    assert wrapped is not None and wrapped.reserve_class == "serve-v2"


def test_the_advice_is_to_raise_the_reserve_not_to_fight_fragmentation() -> None:
    info = parse_oom_message(MSG_STREAM)
    assert info is not None
    settings = parse_conf("expandable_segments:True,expandable_segments_reserve:0.05", "2.15",
                          warn=False).as_dict()
    advice = advise(info, settings, "2.15")
    assert advice[0].rule == "expandable_segments_reserve"
    assert advice[0].conf_change == "expandable_segments_reserve:29G"
    assert "28.00 GiB" in advice[0].reason and "6.99 GiB" in advice[0].reason
    rules = {a.rule for a in advice}
    # 6.62 GiB cached and expandable segments on: no rule may read that as fragmentation
    assert not rules & {"expandable_already_on", "no_allocator_fix", "expandable_segments"}
    assert parse_conf(advice[0].conf_change, "2.15", warn=False)  # a setting torch 2.15 takes


def test_a_reserve_class_gets_its_own_entry_raised_and_the_others_kept() -> None:
    info = parse_oom_message(MSG_CLASS)
    assert info is not None
    settings = parse_conf("expandable_segments:True,expandable_segments_reserve_by_class:"
                          "[weights:0.25,serve-v2:0.05]", "2.15", warn=False).as_dict()
    advice = advise(info, settings, "2.15")
    assert advice[0].rule == "expandable_segments_reserve"
    assert advice[0].conf_change == ("expandable_segments_reserve_by_class:"
                                     "[weights:0.25,serve-v2:29G]")
    assert "'serve-v2'" in advice[0].reason
    without = advise(info, {"expandable_segments": True}, "2.15")  # its list not known
    assert without[0].conf_change is None and "[serve-v2:29G]" in without[0].reason
