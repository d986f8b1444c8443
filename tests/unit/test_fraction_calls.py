"""The recorder's note of ``set_per_process_memory_fraction`` calls (adapters/fraction_calls.py),
with the real CPU torch: the call behaves exactly as before and the function is put back."""

from __future__ import annotations

import pytest

from allocconf_widget.adapters.fraction_calls import noting_fraction_calls

torch = pytest.importorskip("torch")


def test_the_call_is_unchanged_and_the_original_comes_back() -> None:
    original = torch.cuda.set_per_process_memory_fraction
    with noting_fraction_calls(torch) as calls:
        assert torch.cuda.set_per_process_memory_fraction is not original
        assert torch.cuda.memory.set_per_process_memory_fraction is torch.cuda.set_per_process_memory_fraction
        if not torch.cuda.is_available():
            with pytest.raises(Exception) as direct:
                original(0.5)
            with pytest.raises(type(direct.value)):
                torch.cuda.set_per_process_memory_fraction(0.5)
            assert calls == []  # a call that failed changed no limit: nothing noted
    assert torch.cuda.set_per_process_memory_fraction is original
    assert torch.cuda.memory.set_per_process_memory_fraction is original
