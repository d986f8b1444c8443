"""``%%allocconf dryrun``, ``%allocconf simulate`` on its trace and ``%allocconf plan``, in IPython's
real shell on this machine's CPU-only torch (inference steps: see tests/unit/test_dryrun.py for why).

What a user would notice: the summary and prediction are printed, the cell's names and the real
model it moved to "cuda" are left as they were (the dry run works on copies), the What-if ranks the
dry run labelled as an estimate, and the planner prints the largest batch predicted to fit.
"""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError

from allocconf_widget.adapters.recorder import CellRecording
from tests.torch_versions import needs_torch

torch = pytest.importorskip("torch")
pytestmark = needs_torch((2, 4), "the dry run")

CELL = """
moved = model.to("cuda")
with torch.no_grad():
    out = moved(torch.randn(BATCH, 256, device="cuda"))
print(f"loss {out.mean().item():.3f}")
"""


@pytest.fixture(autouse=True)
def _cell_names(ip):
    """What the cells use: torch, a small model on the CPU and a batch size."""
    ip.user_ns["torch"] = torch
    ip.user_ns["model"] = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                              torch.nn.Linear(1024, 256))
    ip.user_ns["BATCH"] = 512
    ip.user_ns.pop("moved", None)
    yield


def test_dryrun_cell_predicts_and_leaves_the_users_model_real(ip, capsys):
    result = ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", CELL)
    out = capsys.readouterr().out
    assert "dry run (estimate)" in out and "CUDA was not started" in out
    assert ("Predicted with the settings this kernel applies: torch's defaults on Tesla T4: "
            "peak reserved") in out
    assert "on Tesla T4" in out
    assert "loss 1.000" in out  # the cell ran; its printed value is the dry run's placeholder
    weight = ip.user_ns["model"][0].weight
    assert type(weight) is torch.nn.Parameter and weight.device.type == "cpu"
    assert "moved" not in ip.user_ns
    assert result.trace.allocations > 3
    assert torch.cuda.is_initialized() is False


def test_a_model_held_by_another_object_keeps_its_weights_and_still_runs(ip, capsys):
    """Only names bound in the notebook are deep-copied; a model in a trainer's attribute or a
    dict is the user's own. ``.to("cuda")`` in the cell replaced its parameters with fakes (the
    trained values gone; the next forward pass aborted the process on this CPU-only build)."""
    ip.run_cell("""
class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = Trainer(torch.nn.Linear(8, 8))
trainer.model.register_buffer("scale", torch.full((8,), 2.0))
models = {"main": torch.nn.Linear(4, 4)}
before = (trainer.model.weight.detach().clone(), models["main"].weight.detach().clone())
""")
    ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", """
with torch.no_grad():
    trainer.model.to("cuda").half()
    models["main"].cuda()
    trainer.model(torch.randn(2, 8, device="cuda", dtype=torch.half))
    trainer.opt.step()
""")
    assert "Predicted with the settings" in capsys.readouterr().out
    ns = ip.user_ns
    for module, weight in ((ns["trainer"].model, ns["before"][0]), (ns["models"]["main"], ns["before"][1])):
        assert type(module.weight) is torch.nn.Parameter and module.weight.device.type == "cpu"
        assert torch.equal(module.weight.detach(), weight)  # the values, not only the type
    assert torch.equal(ns["trainer"].model.scale, torch.full((8,), 2.0))
    opt = ns["trainer"].opt
    assert opt.param_groups[0]["params"][0] is ns["trainer"].model.weight and not opt.state
    ip.run_cell("real_out = trainer.model(torch.randn(3, 8))")  # a real forward pass still runs
    assert ns["real_out"].shape == (3, 8) and torch.cuda.is_initialized() is False
    for name in ("Trainer", "trainer", "models", "before", "real_out"):
        ns.pop(name)


def test_a_tensor_torch_cannot_copy_does_not_stop_the_dry_run(ip, capsys):
    """A loss left by an earlier cell (not a graph leaf) made the namespace copy raise: no dry
    run at all in a notebook that had run one real step."""
    ip.run_cell("earlier_loss = model(torch.randn(2, 256)).sum()")
    try:
        ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", CELL)
        assert "Predicted with the settings" in capsys.readouterr().out
        assert ip.user_ns["earlier_loss"].grad_fn is not None  # the user's own, untouched
    finally:
        ip.user_ns.pop("earlier_loss")


def test_simulate_after_a_dryrun_ranks_the_estimate(ip, capsys):
    ip.run_cell_magic("allocconf", "dryrun --gpu l4", CELL)
    capsys.readouterr()
    report = ip.run_line_magic("allocconf", "-r simulate")
    out = capsys.readouterr().out
    assert "dry run (estimate)" in report.source_label and "dry run (estimate)" in out
    assert "fake CUDA tensors" in out


def test_each_staged_setting_is_predicted_from_the_dry_run(ip, capsys):
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    capsys.readouterr()
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    out = capsys.readouterr().out
    # on a runtime without a GPU (this one) the estimate is the CPU stand-in's, labelled so
    assert re.search(r"Prediction from a dry run \(estimate\) of your step on Tesla T4(, by the CPU stand-in "
                     r"\(a coarser estimate\))?, with max_split_size_mb:256: peak reserved ", out), out
    assert "usable by PyTorch; fits (a dry run's estimate)." in out
    assert "A dry run misses some library workspaces" in out  # labelled an estimate
    assert torch.cuda.is_initialized() is False


def test_plan_reruns_the_cell_per_batch_size(ip, capsys):
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    capsys.readouterr()
    plan = ip.run_line_magic("allocconf", "-r plan BATCH 1024 65536 --gpu t4")
    out = capsys.readouterr().out
    assert plan.largest("", "Tesla T4") == 65536
    assert ("every size tried fits with (torch defaults) (up to batch 65536): the largest that fits is "
            "larger; try larger sizes, e.g. 131072 262144") in out


def test_plan_refuses_a_name_the_cell_never_reads(ip, capsys):
    """``plan BATHC ...`` (a typo) ran the same step at every size and called the largest
    "predicted to fit"; a name that is no variable at all was taken too."""
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    capsys.readouterr()
    with pytest.raises(UsageError, match="the dry-run cell never reads BATHC"):
        ip.run_line_magic("allocconf", "plan BATHC 8 4096 100000000")
    with pytest.raises(UsageError, match="'not a var' is not a variable name"):
        ip.run_line_magic("allocconf", "plan 'not a var' 32")
    assert "largest predicted to fit" not in capsys.readouterr().out


def test_plan_without_a_dryrun_cell_says_what_to_do(ip):
    with pytest.raises(UsageError, match="run a cell with %%allocconf dryrun first"):
        ip.run_line_magic("allocconf", "plan BATCH 8 16")


def test_a_data_dependent_cell_stops_naming_its_line(ip):
    with pytest.raises(UsageError, match=r"if out.sum\(\) > 0:"):
        ip.run_cell_magic("allocconf", "dryrun --gpu t4",
                          "out = torch.randn(4, device='cuda')\nif out.sum() > 0:\n    pass\n")


def test_a_recording_after_a_dryrun_says_how_far_the_estimate_was(ip, capsys):
    """What ``%%allocconf record`` prints after a dry run (the GPU part, recording, cannot run
    here: the bundled H200 recording stands in for it, in the session where record keeps it)."""
    from types import SimpleNamespace

    from allocconf_widget.app.session import get_session
    from allocconf_widget.core.memory.recording import load_demo
    from allocconf_widget.views.magic.dryrun import report_estimate

    ip.run_cell_magic("allocconf", "dryrun --gpu h200", CELL)
    capsys.readouterr()
    demo = load_demo()
    session = get_session(ip)
    session.set_recording(CellRecording(
        snapshot=demo.snapshot(), torch_version=demo.torch_version or "",
        device_total=demo.device_total_bytes, free_at_start=demo.free_at_start_bytes))
    check = report_estimate(SimpleNamespace(session=session))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "How far the dry run's estimate was from this recording" in out
    assert [r.conf for r in check.rows] == ["", "expandable_segments:True", "max_split_size_mb:128",
                                            "roundup_power2_divisions:4"]
    # a small MLP against a CNN recording: the estimate is far below, and says so
    assert all(r.error < -0.5 for r in check.rows)
    assert "ranking of the settings:" in out


def test_the_whatif_tab_shows_each_rows_dry_run_estimate_once_the_real_run_is_recorded(ip, capsys):
    """Closing the loop in the panel: after a dry run and a later recording, every ranked row of
    the What if? tab says what the dry run estimated for that setting and how far it was, and
    the summary whether the dry run ranked the settings as the recording does. The recording
    here is the dry run's own trace (no GPU records here), so each estimate is exact."""
    pytest.importorskip("ipywidgets")
    from allocconf_widget.app.session import get_session
    from allocconf_widget.views.widgets.whatif import WhatIfView

    ip.run_cell_magic("allocconf", "dryrun --gpu h200", CELL)
    capsys.readouterr()
    session = get_session(ip)
    dry = session.dry_run
    view = WhatIfView(session)
    try:
        view.run()
        assert "your dry run estimated" not in "".join(r.box.children[0].children[1].value
                                                        for r in view._rows)  # no recording yet
        session.set_recording(CellRecording(snapshot=dry.snapshot(), torch_version="2.11.0",
                                            device_total=dry.gpu.total_bytes,
                                            free_at_start=dry.gpu.usable_bytes))
        view.run()
        labels = [r.box.children[0].children[1].value for r in view._rows]
        assert len(labels) >= 4
        assert all("your dry run estimated " in label and "(+0.0%)" in label for label in labels)
        assert "Your dry run against this recording (the closed loop): ranking of the settings: " \
               "the same" in view.summary.value
    finally:
        view.close()


def test_a_dry_run_comparison_that_fails_is_said_in_the_summary_not_dropped(ip, capsys, monkeypatch):
    """The comparison beside the ranking fails (forced here: no recording we have makes it
    fail): the ranking still shows, and the summary says the dry run could not be set beside
    it and why, instead of leaving the user to wonder where the estimates went."""
    pytest.importorskip("ipywidgets")
    import allocconf_widget.app.dryrun as dryrun_app
    from allocconf_widget.app.session import get_session
    from allocconf_widget.views.widgets.whatif import WhatIfView

    ip.run_cell_magic("allocconf", "dryrun --gpu h200", CELL)
    capsys.readouterr()
    session = get_session(ip)
    dry = session.dry_run
    session.set_recording(CellRecording(snapshot=dry.snapshot(), torch_version="2.11.0",
                                        device_total=dry.gpu.total_bytes, free_at_start=dry.gpu.usable_bytes))

    def broken(*_args: object) -> None:
        raise ValueError("the recording names a stream the dry run never saw")

    monkeypatch.setattr(dryrun_app, "session_estimate", broken)
    view = WhatIfView(session)
    try:
        view.run()
        assert len(view._rows) >= 4
        assert ("Your dry run could not be set beside this recording (the recording names a stream "
                "the dry run never saw); the ranking above stands.") in view.summary.value
    finally:
        view.close()


def test_plan_chart_draws_one_line_per_setting_and_the_usable_memory(ip, capsys):
    from allocconf_widget.views.charts.dryrun import plan_figure

    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    plan = ip.run_line_magic("allocconf", "-r plan BATCH 1024 65536 --gpu t4")
    capsys.readouterr()
    fig = plan_figure(plan)
    names = [trace.name for trace in fig.data]
    assert names == ["(torch defaults)", "expandable_segments:True"]
    assert list(fig.data[0].x) == [1024, 65536]
    assert any("usable" in (a.text or "") for a in fig.layout.annotations)


def test_a_cell_without_a_cuda_tensor_says_so_and_keeps_nothing(ip, capsys):
    """It was kept as the session's dry run with no allocation in it: the next %allocconf
    simulate then failed, advising torch.cuda.memory._record_memory_history."""
    ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", CELL)  # a usable one first
    capsys.readouterr()
    with pytest.raises(UsageError, match=r"saw no allocation on the GPU.*model\.to\('cuda'\)"):
        ip.run_cell_magic("allocconf", "dryrun --gpu t4", "x = torch.zeros(3)\n")
    ip.run_line_magic("allocconf", "simulate")  # still ranks the earlier dry run
    assert "dry run (estimate)" in capsys.readouterr().out


def test_plan_says_a_failing_size_in_one_line(ip, capsys):
    ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", CELL)
    capsys.readouterr()
    ip.run_line_magic("allocconf", "plan BATCH 64 99999999999999999999999")
    out = capsys.readouterr().out
    assert "frame #" not in out and len(out.splitlines()) < 20, out


def test_a_dry_run_of_too_many_steps_stops_with_a_message(ip, monkeypatch):
    from allocconf_widget.adapters.dryrun import log as adapter

    monkeypatch.setattr(adapter, "MAX_ENTRIES", 50)  # the real bound is 1,000,000 entries
    with pytest.raises(UsageError, match="more than 50 allocator calls; a dry run is for one step"):
        ip.run_cell_magic("allocconf", "dryrun --gpu t4", "with torch.no_grad():\n"
                          "    xs = [torch.empty(8, device='cuda') for _ in range(100)]\n")
    assert torch.cuda.is_initialized() is False


def test_the_whatif_tab_names_the_dry_run_it_replays(ip, capsys):
    """Its label said "the bundled H200 recording" above a result replaying the dry run."""
    from allocconf_widget.app.session import get_session
    from allocconf_widget.views.widgets.whatif import WhatIfView

    view = WhatIfView(get_session(ip))
    try:
        assert "bundled H200 recording" in view.source.value
        ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
        capsys.readouterr()
        assert "dry run (estimate) of your step on Tesla T4" in view.source.value  # on the change
        report = view.run()
        assert report is not None and report.source_label in view.source.value
    finally:
        view.close()


def test_the_dry_run_predicts_the_settings_the_kernel_applies(ip, capsys):
    """It printed torch's defaults while the kernel ran max_split_size_mb:128 and the Settings
    tab, on the same dry run, replayed that."""
    ip.run_line_magic("allocconf", "set max_split_size_mb=128")
    ip.run_line_magic("allocconf", "apply --no-save")
    capsys.readouterr()
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    out = capsys.readouterr().out
    assert ("Predicted with the settings this kernel applies: max_split_size_mb:128 on Tesla T4: "
            "peak reserved") in out
    assert "dry run (dry run" not in out


def test_plan_runs_on_copies_as_the_dry_run_does(ip, capsys):
    """``plan`` made its copy of the notebook inside the dry run, where a tensor cannot be
    copied; it then ran the cell on the user's own model, which kept what the cell added
    (a fake layer: the next real forward pass aborted the process)."""
    cell = ('model.to("cuda")\nmodel.append(torch.nn.Linear(256, 256).to("cuda"))\n'
            'with torch.no_grad():\n    out = model(torch.randn(BATCH, 256, device="cuda"))\n')
    ip.user_ns["model"].register_buffer("scale", torch.ones(4))
    ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", cell)
    ip.run_line_magic("allocconf", "plan BATCH 8 16")
    out = capsys.readouterr().out
    assert "dry run failed" not in out
    model = ip.user_ns["model"]
    assert len(model) == 3 and type(model[0].weight) is torch.nn.Parameter
    assert model(torch.randn(2, 256)).shape == (2, 256)  # a real forward pass still runs


def test_an_optimizer_made_earlier_steps_the_moved_model_and_is_restored(ip, capsys):
    """Its restore never ran (``torch.optim.optimizer`` is not the module: torch deletes that
    name), so a momentum buffer stayed fake; it also held the stale CPU parameters, so its
    state was missing from the estimate; a scheduler made in the cell changed its lr."""
    ip.run_cell("""
class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(64, 64)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.5, momentum=0.9)
trainer = Trainer()
""")
    step = """
with torch.no_grad():
    {prefix}trainer.model.to("cuda")
    {make}
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.01)
    for p in trainer.model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
"""
    try:
        earlier = ip.run_cell_magic("allocconf", "-r dryrun --gpu t4",
                                    step.format(prefix="", make="opt = trainer.opt"))
        inside = ip.run_cell_magic("allocconf", "-r dryrun --gpu t4", step.format(
            prefix="", make="opt = torch.optim.SGD(trainer.model.parameters(), lr=0.5, momentum=0.9)"))
        capsys.readouterr()
        assert earlier.trace.peak_requested == inside.trace.peak_requested  # the momentum buffers
        opt = ip.user_ns["trainer"].opt
        assert not opt.state and opt.param_groups[0]["lr"] == 0.5
        assert "initial_lr" not in opt.param_groups[0]
        assert opt.param_groups[0]["params"][0] is ip.user_ns["trainer"].model.weight
        ip.run_cell("trainer.model.weight.grad = torch.ones(64, 64)\ntrainer.opt.step()")  # real
        assert type(next(iter(opt.state.values()))["momentum_buffer"]) is torch.Tensor
    finally:
        for name in ("Trainer", "trainer", "opt", "sched", "p"):
            ip.user_ns.pop(name, None)


def test_torch_defaults_a_cell_sets_are_put_back(ip, capsys):
    """A cell that starts as training scripts do (``set_default_device("cuda")``, a default
    dtype) and builds a model (drawing from the CPU generator) leaves none of it behind: a
    later real ``torch.zeros`` is a float32 CPU tensor again, and the real run draws the same
    random numbers it would have drawn without the dry run."""
    rng_before = torch.get_rng_state()
    ip.run_cell_magic("allocconf", "dryrun", "\n".join([
        "layer = torch.nn.Linear(256, 256)",  # initial weights from the CPU generator
        "torch.set_default_device('cuda')",
        "torch.set_default_dtype(torch.float64)",
        "torch.set_grad_enabled(False)",
        "torch.backends.cudnn.benchmark = True",
        "with torch.no_grad():",
        "    y = layer.to('cuda')(torch.zeros(64, 256, dtype=torch.float32))",
    ]))
    assert "A dry run" in capsys.readouterr().out
    after = torch.zeros(2)
    assert after.device.type == "cpu" and after.dtype == torch.float32
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.is_grad_enabled() and torch.backends.cudnn.benchmark is False


@needs_torch((2, 6), "the fake-tensor kernel entry this test interrupts")
def test_ctrl_c_as_a_fake_op_enters_its_kernel_leaves_torch_usable(ip, monkeypatch):
    """A Ctrl-C landing as torch's ``in_kernel_invocation_manager`` has been entered, before the
    ``with`` holding it takes hold, left its generator suspended: the thread's meta dispatch
    flag stayed on (every later CPU op recursed until the kernel restarted; 2 of 6 timed
    interrupts), and finalized later, at random, it broke autograd. Modelled by raising right
    after the real ``__enter__``; the interrupt reaches the user, torch and autograd work after
    it, and keep working once the shell lets the traceback go."""
    import gc
    import sys

    from torch._subclasses import fake_tensor

    original = fake_tensor.in_kernel_invocation_manager
    entered = [0]

    class InterruptedOnEntry:
        def __init__(self, mode):
            self.inner = original(mode)

        def __enter__(self):
            got = self.inner.__enter__()
            entered[0] += 1
            if entered[0] == 20:
                raise KeyboardInterrupt  # the signal, delivered at this bytecode boundary
            return got

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    def torch_works() -> None:
        assert torch._C._meta_in_tls_dispatch_include() is False
        assert torch.equal(torch.ones(3) + 1, torch.full((3,), 2.0))
        weight = torch.ones(2, requires_grad=True)
        (weight * 3).sum().backward()
        assert torch.equal(weight.grad, torch.full((2,), 3.0))

    monkeypatch.setattr(fake_tensor, "in_kernel_invocation_manager", InterruptedOnEntry)
    # as a notebook runs the cell: the shell keeps the traceback (``%debug`` reads it)
    result = ip.run_cell("%%allocconf dryrun\nkeep = [torch.empty(1024, device='cuda') for i in range(200)]")
    monkeypatch.undo()
    assert isinstance(result.error_in_exec, KeyboardInterrupt) and entered[0] == 20
    torch_works()
    ip.run_cell("1 / 0")  # the next error takes the kept traceback's place
    sys.last_traceback = sys.last_value = None
    gc.collect()
    torch_works()


def test_ctrl_c_during_the_prediction_after_the_cell_says_one_line(ip, monkeypatch):
    """The prediction after the cell replays the trace (seconds on a long step): a Ctrl-C there
    showed our frames; the user's own cell keeps its traceback (the test above)."""
    from allocconf_widget.app.dryrun import DryRunResult

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DryRunResult, "predict", interrupted)
    with pytest.raises(UsageError, match=r"^%%allocconf dryrun interrupted after your cell ran$"):
        ip.run_cell_magic("allocconf", "dryrun", CELL)


def test_a_bad_save_path_is_said_before_the_cell_runs_and_keeps_the_dry_run(ip, capsys, tmp_path):
    from allocconf_widget.app.session import get_session

    ip.run_cell_magic("allocconf", "dryrun", CELL)
    kept = get_session(ip).dry_run
    assert kept is not None
    capsys.readouterr()
    ip.user_ns["BATCH"] = 4096
    for bad in (str(tmp_path / "missing" / "step.pickle"), "", str(tmp_path)):
        with pytest.raises(UsageError, match="--save"):
            ip.run_cell_magic("allocconf", f"dryrun --save '{bad}'", CELL)
        assert get_session(ip).dry_run is kept
    out = capsys.readouterr().out
    assert "A dry run" not in out and "loss" not in out, out  # the cell never ran


def test_a_saved_dry_run_is_named_by_the_cli_as_the_session_names_it(ip, capsys, tmp_path):
    from allocconf_widget.app.sources import file_source

    path = tmp_path / "step.pickle"
    ip.run_cell_magic("allocconf", f"dryrun --gpu t4 --save {path}", CELL)
    label = file_source(str(path)).label
    assert label.startswith(str(path)) and "dry run (estimate) of a step on Tesla T4" in label, label


def test_a_bad_sidecar_path_is_said_before_the_cell_runs_and_keeps_the_old_pickle(ip, capsys, tmp_path):
    import os

    old = tmp_path / "step.pickle"
    old.write_bytes(b"an older snapshot")
    os.mkfifo(tmp_path / "step.json")
    with pytest.raises(UsageError, match=r"step\.json"):
        ip.run_cell_magic("allocconf", f"dryrun --save {old}", CELL)
    assert old.read_bytes() == b"an older snapshot"
    assert "A dry run" not in capsys.readouterr().out


def test_a_save_never_replaces_a_json_file_of_the_users_and_names_both_files(ip, capsys, tmp_path):
    """``--save results`` wrote its sidecar over the user's own ``results.json`` and said only
    that the pickle was saved: a file there that is not a recording's sidecar is refused before
    the cell runs; a sidecar of an earlier save is replaced, and the line names both files."""
    mine = tmp_path / "results.json"
    mine.write_text('{"my": "precious data"}')
    with pytest.raises(UsageError, match=r"results\.json' exists and is not a recording's sidecar"):
        ip.run_cell_magic("allocconf", f"dryrun --gpu t4 --save {tmp_path / 'results'}", CELL)
    assert mine.read_text() == '{"my": "precious data"}' and not (tmp_path / "results").exists()
    assert "A dry run" not in capsys.readouterr().out
    path = tmp_path / "step.pickle"
    for _ in range(2):  # the second save replaces the first one's sidecar
        ip.run_cell_magic("allocconf", f"dryrun --gpu t4 --save {path}", CELL)
        out = capsys.readouterr().out
        said = f"Saved the dry-run snapshot to {path}, and the GPU and torch it predicts for to "
        assert f"{said}{tmp_path / 'step.json'}" in out, out
    assert '"device_total_bytes"' in (tmp_path / "step.json").read_text()


def test_the_library_save_refuses_a_json_file_of_the_users_too(tmp_path):
    from allocconf_widget._errors import SnapshotError
    from allocconf_widget.app.dryrun import DryRunResult

    mine = tmp_path / "step.json"
    mine.write_text("[1, 2, 3]")
    result = object.__new__(DryRunResult)  # save() checks both paths before it reads the run
    with pytest.raises(SnapshotError, match=r"step\.json' exists and is not a recording's sidecar"):
        result.save(tmp_path / "step.pickle")
    assert mine.read_text() == "[1, 2, 3]" and not (tmp_path / "step.pickle").exists()
