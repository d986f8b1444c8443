"""Every public name of ``torch.cuda``, ``torch.cuda.memory`` and ``torch.accelerator`` of the
installed torch is answered, harmless or refused in a dry run, as one table says, and that table
is the one docs/dryrun.md shows.

Before, calls the dry run did not answer (device and stream selection, the memory fraction,
generators, events, snapshots, synchronisation) reached CUDA's start-up or froze the allocator
settings, and ``is_available()`` said False on a machine without a GPU while other queries were
answered from the profile. On this machine (no GPU) a reached start-up raises instead of
starting; tests/gpu/test_dryrun_entry_points_gpu.py checks each row on a GPU.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from allocconf_widget._errors import DryRunError
from allocconf_widget.core.dryrun.entry_points import ANSWERED, HARMLESS, REFUSED, TABLE, lookup
from tests.dryrun_calls import call
from tests.torch_versions import needs_torch

torch = pytest.importorskip("torch")
pytestmark = needs_torch((2, 4), "the dry run")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "dryrun.md"
BEGIN, END = "<!-- entry points: begin -->", "<!-- entry points: end -->"


def _module(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _installed_rows():
    return [row for row in TABLE if hasattr(_module(row.module), row.name)]


def render_table() -> str:
    """The table as docs/dryrun.md shows it: one line per module, kind and treatment."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in TABLE:
        groups.setdefault((row.module, row.kind, row.what), []).append(row.name)
    lines = ["| module | names | in a dry run |", "|---|---|---|"]
    for (module, kind, what), names in groups.items():
        listed = ", ".join(f"`{n}`" for n in names)
        lines.append(f"| `{module}` | {listed} | **{kind}**: {what} |")
    return "\n".join(lines)


@pytest.mark.parametrize("module", ["torch.cuda", "torch.cuda.memory", "torch.accelerator"])
def test_every_public_name_of_the_installed_torch_is_in_the_table(module):
    found = _module(module)
    if found is None:
        pytest.skip(f"this torch has no {module}")
    missing = [name for name in getattr(found, "__all__", ()) if lookup(module, name) is None]
    assert missing == [], f"add these to core/dryrun/entry_points.py: {missing}"


def test_docs_dryrun_md_shows_the_table():
    text = DOCS.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == render_table(), "docs/dryrun.md's table differs: paste render_table() between the markers"


def _in_dry_run(code: str, *, standin: bool | None = None) -> object:
    import allocconf_widget

    namespace = {"torch": torch}
    with allocconf_widget.dry_run("t4", standin=standin, progress=False) as run:
        exec(compile(code, "<step>", "exec"), namespace)
    return run


@pytest.mark.parametrize("row", [r for r in _installed_rows() if r.kind == ANSWERED],
                         ids=lambda r: r.qualified)
def test_each_answered_row_answers_without_starting_cuda(row):
    _in_dry_run(call(row))
    assert torch.cuda.is_initialized() is False


@pytest.mark.parametrize("row", [r for r in _installed_rows() if r.kind == HARMLESS],
                         ids=lambda r: r.qualified)
def test_each_harmless_row_runs(row):
    _in_dry_run(call(row))
    assert torch.cuda.is_initialized() is False


@pytest.mark.parametrize("row", [r for r in _installed_rows() if r.kind == REFUSED],
                         ids=lambda r: r.qualified)
def test_each_refused_row_stops_with_one_line_naming_the_call_and_the_line(row, tmp_path):
    step = tmp_path / "step.py"
    step.write_text(f"import torch\n{call(row)}\n")
    with pytest.raises(DryRunError) as caught:
        _in_dry_run(step.read_text())
    message = str(caught.value)
    assert row.qualified in message and "\n" not in message
    assert "line 2" in message or "<step>" in message
    assert torch.cuda.is_initialized() is False


@needs_torch((2, 6), "torch.accelerator")
def test_the_answers_come_from_the_profile_and_the_recording():
    import allocconf_widget

    with allocconf_widget.dry_run("a100-80", progress=False) as run, torch.no_grad():
        props = torch.cuda.get_device_properties(0)
        first = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        del first
        torch.cuda.reset_peak_memory_stats()
        after_reset = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        accelerator = torch.accelerator.current_accelerator()
    assert (props.name, props.major, props.minor) == ("NVIDIA A100-SXM4-80GB", 8, 0)
    assert allocated == peak == 1 << 20 and after_reset == 0
    assert total == 80 << 30 and free == run.gpu.usable_bytes
    assert str(accelerator) == "cuda"


def test_a_device_other_than_the_first_is_refused_in_one_line():
    with pytest.raises(DryRunError, match=r"^set_device\(1\): a dry run predicts one GPU, device 0; "
                                          r"called at .*test_dryrun_entry_points\.py"):
        _in_dry_run_set_device()


def _in_dry_run_set_device() -> None:
    import allocconf_widget

    with allocconf_widget.dry_run("t4", progress=False):
        torch.cuda.set_device(1)


def test_a_name_a_newer_torch_adds_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "__all__", [*torch.cuda.__all__, "brand_new_call"], raising=False)
    monkeypatch.setattr(torch.cuda, "brand_new_call", lambda: "ran for real", raising=False)
    with pytest.raises(DryRunError, match=r"torch\.cuda\.brand_new_call.*not in the dry run's table"):
        _in_dry_run("torch.cuda.brand_new_call()")
    assert torch.cuda.brand_new_call() == "ran for real"  # put back afterwards


def test_a_cuda_start_the_table_does_not_know_is_refused_naming_the_line():
    """The backstop: torch.cuda._lazy_init, which every CUDA start goes through, refuses."""
    code = textwrap.dedent("""
        import torch.cuda.random
        torch.cuda.random.get_rng_state()
    """)
    with pytest.raises(DryRunError, match=r"would start CUDA .* called at <step>, line 3"):
        _in_dry_run(code)


def test_the_table_says_what_each_row_does_in_words_a_user_reads():
    for row in TABLE:
        assert row.kind in (ANSWERED, HARMLESS, REFUSED)
        assert row.what and not re.search(r"\b(TODO|XXX)\b", row.what)


def test_every_class_of_the_table_is_still_a_class_inside_the_dry_run():
    """``torch.cuda.CUDAGraph`` became a function in a dry run, so code that uses such a class
    as a class while the step runs broke: transformers' generation module (imported lazily by
    ``from_pretrained``) annotates ``torch.cuda.CUDAGraph | None`` and stopped every Llama dry
    run on a GPU with TypeError. Each class keeps ``X | None``, ``isinstance`` and its
    attributes; a refused one still refuses when called, and the original is back afterwards."""
    import allocconf_widget

    classes = [(row, getattr(_module(row.module), row.name)) for row in _installed_rows()
               if isinstance(getattr(_module(row.module), row.name), type)]
    assert any(row.name == "CUDAGraph" for row, _ in classes)
    seen: dict[str, tuple[bool, bool, object]] = {}
    with allocconf_widget.dry_run("t4", progress=False):
        for row, _ in classes:
            inside = getattr(_module(row.module), row.name)
            seen[row.qualified] = (isinstance(inside, type), isinstance(object(), inside),
                                   inside | None)
    for row, original in classes:
        is_class, matched, union = seen[row.qualified]
        assert is_class and not matched and union is not None, row.qualified
        assert getattr(_module(row.module), row.name) is original, row.qualified
    refused = [row for row, _ in classes if row.kind == REFUSED]
    for row in refused:
        with pytest.raises(DryRunError, match=re.escape(f"{row.qualified}() cannot run in a dry run")), \
                allocconf_widget.dry_run("t4", progress=False):
            getattr(_module(row.module), row.name)()
    assert torch.cuda.is_initialized() is False
