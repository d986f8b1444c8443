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


def _stand_in() -> object:
    """A torch-shaped namespace whose fraction call succeeds: the CPU build here has no CUDA
    device, so its real call always raises (the GPU tests note real calls on the H200)."""
    from types import SimpleNamespace

    limits: list[tuple[float, object]] = []

    def set_per_process_memory_fraction(fraction: float, device: object = None) -> None:
        limits.append((fraction, device))

    memory = SimpleNamespace(set_per_process_memory_fraction=set_per_process_memory_fraction)
    cuda = SimpleNamespace(memory=memory, set_per_process_memory_fraction=set_per_process_memory_fraction,
                           current_device=lambda: 0, limits=limits)
    return SimpleNamespace(cuda=cuda, device=torch.device)


def test_the_flight_log_keeps_the_newest_calls_and_puts_the_function_back() -> None:
    from allocconf_widget.adapters.fraction_calls import FractionCallLog

    fake = _stand_in()
    original = fake.cuda.set_per_process_memory_fraction  # type: ignore[attr-defined]
    log = FractionCallLog(keep=3)
    assert log.install(fake) and log.install(fake)  # idempotent: wrapped once
    for i in range(5):
        fake.cuda.set_per_process_memory_fraction(0.1 * (i + 1), "cuda:1")  # type: ignore[attr-defined]
    fake.cuda.memory.set_per_process_memory_fraction(0.9)  # type: ignore[attr-defined]
    assert len(fake.cuda.limits) == 6  # type: ignore[attr-defined]  # every call went through
    calls = log.calls()
    assert [round(c["fraction"], 1) for c in calls] == [0.4, 0.5, 0.9]
    assert [c["device"] for c in calls] == [1, 1, 0]
    assert all(isinstance(c["time_us"], int) for c in calls)
    assert calls[0]["time_us"] <= calls[-1]["time_us"]
    log.remove()
    assert fake.cuda.set_per_process_memory_fraction is original  # type: ignore[attr-defined]
    assert fake.cuda.memory.set_per_process_memory_fraction is original  # type: ignore[attr-defined]


def test_a_patch_made_over_ours_stays() -> None:
    from allocconf_widget.adapters.fraction_calls import FractionCallLog

    fake = _stand_in()
    log = FractionCallLog()
    log.install(fake)

    def theirs(fraction: float, device: object = None) -> None:
        return None

    fake.cuda.set_per_process_memory_fraction = theirs  # type: ignore[attr-defined]
    log.remove()
    assert fake.cuda.set_per_process_memory_fraction is theirs  # type: ignore[attr-defined]


def test_the_recorders_notes_replay_as_a_limit_change() -> None:
    """What the log writes is what core/sim/limits.py reads."""
    from allocconf_widget.adapters.fraction_calls import noting_fraction_calls
    from allocconf_widget.core.sim.limits import read_fraction_changes

    fake = _stand_in()
    with noting_fraction_calls(fake) as calls:
        fake.cuda.set_per_process_memory_fraction(0.25, 0)  # type: ignore[attr-defined]
    changes = read_fraction_changes({"allocconf_fraction_changes": calls})
    assert [(c.device, c.fraction) for c in changes] == [(0, 0.25)]
