"""Predict before CUDA starts: dry-run the user's step, then replay it under any setting.

``allocconf_widget.dry_run()`` and ``%%allocconf dryrun`` run the user's unchanged code on
fake CUDA tensors (:mod:`allocconf_widget.adapters.dryrun`) and give a :class:`DryRunResult`:
a trace in torch's snapshot format that ``allocconf simulate``, ``%allocconf simulate`` and
the What if? tab replay like a recording, labelled "dry run (estimate)". :func:`predict`
answers one setting on one GPU (peak reserved, fits or not) fast enough for a slider, and
:func:`plan_batch` dry-runs several batch sizes and reports the largest predicted to fit per
setting and GPU. docs/dryrun.md says what a dry run cannot see and how far it was measured.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from allocconf_widget._errors import AllocConfError, AllocConfWarning, DryRunError, RuntimeStateError
from allocconf_widget.core.dryrun.facts import GAPS, LABEL, SNAPSHOT_MARK, STANDIN_LABEL
from allocconf_widget.core.dryrun.profiles import GpuProfile, profile
from allocconf_widget.core.units import format_bytes

if TYPE_CHECKING:
    from types import TracebackType

    from allocconf_widget.adapters.dryrun.namespace import CopyReport
    from allocconf_widget.adapters.dryrun.run import DryRunTrace
    from allocconf_widget.app.simulate import SimulationReport, SimulationRow
    from allocconf_widget.app.sources import RecordingHolder, TraceSource
    from allocconf_widget.app.trace_cache import TraceCache
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.dryrun.dispatch import Dispatch
    from allocconf_widget.core.sim.outcome import Outcome

    class EstimateHolder(RecordingHolder, Protocol):
        """What :func:`session_estimate` needs of the Session (a protocol: the Session imports
        this module)."""

        @property
        def trace_cache(self) -> TraceCache: ...



def resolve_gpu(gpu: str | GpuProfile | None) -> tuple[GpuProfile, str | None]:
    """The profile to predict for, and a note when it was chosen for the user.

    None: the GPU this runtime has (NVML; CUDA does not start), else a T4 (Colab's free GPU).
    """
    if isinstance(gpu, GpuProfile):
        return gpu, None
    if gpu is not None:
        return profile(gpu), None
    from allocconf_widget.adapters.nvml import runtime_profile

    found = runtime_profile()
    if found is not None:
        return found, None
    return profile("t4"), "no GPU visible to NVML: predicting for a Tesla T4 (pass gpu= to choose)"


def cell_namespace(user_ns: dict[str, Any], source: str | None = None) -> tuple[dict[str, Any], CopyReport]:
    """The namespace a dry-run cell runs in: a copy of the notebook's, so names the cell
    assigns and models it moves to "cuda" stay as they were outside it. With the cell's
    ``source``, only the tensors, models and optimizers it reads are copied."""
    from allocconf_widget.adapters.dryrun.namespace import isolated_namespace
    from allocconf_widget.core.dryrun.cell import global_reads

    return isolated_namespace(user_ns, global_reads(source) if source is not None else None)


def sidecar_path(target: Path) -> Path:
    """Where a saved dry run's JSON sidecar goes: ``step.json`` beside ``step.pickle[.gz]``."""
    name = target.name
    for suffix in (".pickle.gz", ".pickle", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return target.with_name(name + ".json")


def check_save_targets(target: Path) -> Path:
    """Refuse a save before anything is written: the pickle's path as any saved file, and its
    sidecar's where a file there is the user's own (not a recording's sidecar). Returns the
    sidecar's path.

    Raises:
        NotRegularFileError: which of the two cannot be written, and why.
    """
    from allocconf_widget.core.memory.recording import SIDECAR_MAX_BYTES, is_recording_sidecar
    from allocconf_widget.core.untrusted import check_companion_target, check_write_target

    check_write_target(target)
    sidecar = sidecar_path(target)
    check_companion_target(sidecar, is_ours=is_recording_sidecar, what="a recording's sidecar",
                           limit=SIDECAR_MAX_BYTES)
    return sidecar


@dataclass(frozen=True)
class DryRunCell:
    """The cell a dry run ran, as the batch planner re-runs it with each size."""

    code: str
    gpu: str | None
    standin: bool = False  # it ran on the CPU stand-in (the planner does too)


@dataclass
class DryRunResult:
    """One dry run: its trace, the GPU it predicts for, and what it cannot see."""

    trace: DryRunTrace
    gpu: GpuProfile
    notes: tuple[str, ...] = ()
    copy: CopyReport | None = None  # what the notebook copy took (a cell dry run only)
    _decoded: Any = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------- the trace as a snapshot
    def snapshot(self) -> dict[str, Any]:
        """The trace as ``torch.cuda.memory._snapshot()`` lays it out (device 0, no segments:
        the replay makes its own), with the settings the environment held as "recorded" and the
        step's memory-fraction calls, which the replay applies where they happened."""
        from allocconf_widget.core.sim.limits import FRACTION_CHANGES_KEY

        snapshot: dict[str, Any] = {
            "segments": [],
            "device_traces": [list(self.trace.entries)],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": self.trace.conf_text},
            SNAPSHOT_MARK: {"gpu": self.gpu.key, "gpu_name": self.gpu.name,
                            "torch": self.trace.torch_version, "ops": self.trace.ops,
                            "standin": self.trace.standin, "notes": list(self.all_notes())},
        }
        if self.trace.fraction_changes:
            snapshot[FRACTION_CHANGES_KEY] = [dict(change) for change in self.trace.fraction_changes]
        return snapshot

    def all_notes(self) -> tuple[str, ...]:
        return (*self.notes, *self.trace.notes)

    @property
    def label(self) -> str:
        """How every view names this trace: an estimate, and for which GPU."""
        how = f", {STANDIN_LABEL}" if self.trace.standin else ""
        return f"a {LABEL} of your step on {self.gpu.name}{how}"

    def dispatch(self) -> Dispatch:
        """What the profile decided about the step's kernels and workspaces."""
        from allocconf_widget.core.dryrun.dispatch import dispatch

        return dispatch(self.gpu, cudnn_preferred=self.trace.cudnn_preferred)

    def require_allocations(self) -> None:
        """Raise :class:`DryRunError` when the step made no tensor on the GPU: there is nothing
        to predict from (the replay then advised ``_record_memory_history``, wrongly)."""
        if not self.trace.allocations:
            raise DryRunError("the dry run saw no allocation on the GPU: the step made every "
                              "tensor on the CPU. Move the model and the batch to 'cuda' in the "
                              "cell (model.to('cuda'), batch.to('cuda')), as the real step would")

    def source(self) -> TraceSource:
        """What the what-if replays: labelled an estimate, on this GPU's usable memory."""
        from allocconf_widget.app.sources import TraceSource, recorded_release
        from allocconf_widget.core.sim.notes import Note, NoteKind

        self.require_allocations()
        notes = tuple(Note(NoteKind.ESTIMATE, n) for n in (*GAPS, *self.all_notes()))
        return TraceSource(self.snapshot(), self.label,
                           recorded_release(self.trace.torch_version), self.gpu.total_bytes,
                           self.gpu.context_bytes, notes=notes, limit_known=True,
                           decoded=self.decoded(),  # predict and the what-if share one decoding
                           estimate=True)

    def decoded(self) -> Any:
        """The decoded trace (once): every :func:`predict` on this run shares it."""
        if self._decoded is None:
            from allocconf_widget.core.sim.trace.extract import extract_trace

            self._decoded = extract_trace(self.snapshot())
        return self._decoded

    def save(self, path: str | Path) -> Path:
        """Write the snapshot (``allocconf simulate PATH`` replays it; pytorch.org/memory_viz
        opens it) and a JSON sidecar with the GPU's memory and the torch release.

        Raises:
            SnapshotError: the file cannot be written (a name with a NUL character or longer
                than the file system allows among them): the message says why and what to
                give instead, and nothing was written.
        """
        from allocconf_widget._errors import SnapshotError, printable
        from allocconf_widget.core.memory.snapshot import save_snapshot
        from allocconf_widget.core.untrusted import NotRegularFileError

        target = Path(path)
        shown = printable(str(path), 120, newlines=False)
        try:  # both paths before either file: a bad sidecar path replaced the pickle, then failed
            sidecar = check_save_targets(target)
        except NotRegularFileError as exc:
            raise SnapshotError(f"cannot save the dry run as {shown}: {exc}") from None
        save_snapshot(self.snapshot(), target)  # type: ignore[arg-type]
        meta = {"workload": "dry run", "description": f"a {LABEL} for {self.gpu.name}",
                "torch": self.trace.torch_version, "device_name": self.gpu.name,
                "device_total_bytes": self.gpu.total_bytes,
                "free_at_start_bytes": self.gpu.usable_bytes, "conf": self.trace.conf_text,
                "dry_run": True, "standin": self.trace.standin, "trace_events": len(self.trace.entries)}
        from allocconf_widget.core.untrusted import replace_file_atomically

        try:  # as the snapshot is written: a link replaced, a FIFO or device refused
            replace_file_atomically(sidecar, json.dumps(meta, indent=1).encode("utf-8"))
        except OSError as exc:
            raise SnapshotError(f"wrote {shown} but not its sidecar "
                                f"{printable(str(sidecar), 120, newlines=False)}: {exc}") from exc
        return target

    def predict(self, conf: str | AllocConf = "", gpu: str | GpuProfile | None = None) -> Prediction:
        """:func:`predict` for this run (``gpu`` defaults to the run's)."""
        return predict(self, conf, gpu if gpu is not None else self.gpu)

    def summary(self) -> str:
        t = self.trace
        kind = f"A {LABEL}, {STANDIN_LABEL}," if t.standin else f"A {LABEL}"
        lines = [f"{kind} for {self.gpu.describe()}: {t.ops:,} ops, "
                 f"{t.allocations:,} allocations in {t.seconds:.2f} s; peak requested "
                 f"{format_bytes(t.peak_requested)}, {format_bytes(t.live_at_end)} still allocated "
                 "at the end. CUDA was not started."]
        lines += [f"{self.gpu.name}: {line}" for line in self.dispatch().lines()]
        if self.copy is not None:
            lines.append(copy_sentence(self.copy))
        lines += [f"note: {n}" for n in self.all_notes()]
        return "\n".join(lines)


def copy_sentence(report: CopyReport) -> str:
    """What the namespace copy took, in one line."""
    if not report.names:
        text = "The cell reads no tensor, model or optimizer of the notebook: nothing was copied"
    else:
        more = f" and {len(report.names) - 6} more" if len(report.names) > 6 else ""
        names = ", ".join(report.names[:6]) + more
        text = (f"Copied what the cell reads ({names}): {format_bytes(report.host_bytes)} of host memory"
                + (f" and {format_bytes(report.gpu_bytes)} of GPU memory" if report.gpu_bytes else "")
                + f", {report.seconds:.2f} s")
    if report.left:
        text += (f"; {', '.join(report.left)} could not be copied (the cell used your own, put back "
                 "afterwards)")
    return text + "."


class DryRunContext:
    """``with allocconf_widget.dry_run() as run: <your step>``; then ``run.save(path)``,
    ``run.predict(conf)`` … (the same object is the :class:`DryRunResult` afterwards)."""

    def __init__(self, gpu: str | GpuProfile | None = None, *, rules: bool = True,
                 standin: bool | None = None, progress: Callable[[int], None] | None = None) -> None:
        self.gpu, note = resolve_gpu(gpu)
        self._notes = (note,) if note else ()
        self._rules = rules
        self._standin = standin
        self._progress = progress
        self._run: Any = None
        self.copy: CopyReport | None = None
        self.result: DryRunResult | None = None

    def __enter__(self) -> DryRunContext:
        from allocconf_widget.adapters.dryrun.run import DryRun

        standin = self._standin if self._standin is not None else standin_here()
        self._run = DryRun(self.gpu, rules=self._rules, standin=standin, progress=self._progress)
        self._run.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._run.__exit__(kind, exc, tb)
        finally:
            if self._run.trace is not None:
                self.result = DryRunResult(self._run.trace, self.gpu, self._notes, self.copy)

    def _done(self) -> DryRunResult:
        if self.result is None:
            raise RuntimeStateError("the dry run has not finished: use the result after the "
                                    "`with` block")
        return self.result

    def __getattr__(self, name: str) -> Any:  # save, predict, summary, snapshot, trace …
        if name.startswith("_") or name in ("gpu", "result", "copy"):
            raise AttributeError(name)
        return getattr(self._done(), name)


def dry_run(gpu: str | GpuProfile | None = None, *, rules: bool = True, standin: bool | None = None,
            progress: Callable[[int], None] | None = None) -> DryRunContext:
    """Run the block on fake CUDA tensors and record what it would allocate; CUDA never starts.

    ``gpu``: a profile name (``t4``, ``l4``, ``a100-40``, ``a100-80``, ``h100``, ``h200``) or
    None for this runtime's GPU. ``rules=False`` keeps the raw trace (no modelled cuBLAS/cuDNN
    workspaces). ``standin``: run on the CPU stand-in (a coarser estimate, labelled so); None
    chooses it where no GPU is visible, where fake CUDA tensors cannot record gradients.
    ``progress(ops)`` is called every few hundred ops while the block runs.
    """
    return DryRunContext(gpu, rules=rules, standin=standin, progress=progress)


def standin_here() -> bool:
    """The dry run takes the CPU stand-in here: no GPU a fake CUDA backward could use (a CPU-only
    torch, or none visible), or a torch whose fake CUDA tensors would start CUDA."""
    from allocconf_widget.adapters.dryrun.run import standin_needed

    return standin_needed()


# ---------------------------------------------------------------- one prediction (a slider)

@dataclass(frozen=True)
class Prediction:
    """What one setting would do on one GPU, from a dry run or a recording: a row of the one
    replay (:func:`allocconf_widget.app.simulate.simulate`), with the fields ``run.predict()``
    has always had. Its sentence is ``views/text/forecast.py``'s, as every view's."""

    conf: str
    gpu: str
    peak_reserved: int
    peak_allocated: int
    #: the memory the step may reserve: a memory fraction's share where one binds, else what
    #: the device leaves to PyTorch (0: the device's size is unknown)
    usable: int
    fits: bool  # the step runs to its end without an OOM that stops it (Outcome.fits is True)
    oom_at_bytes: int | None = None  # the request that would fail, when it does not fit
    estimate: bool = True  # from a dry run (else a recording's exact replay)
    row: SimulationRow | None = field(default=None, compare=False, repr=False)

    @property
    def outcome(self) -> Outcome:
        """What the setting does to the step, as every view words it."""
        assert self.row is not None
        return self.row.outcome

    @property
    def headroom(self) -> int:
        return self.usable - self.peak_reserved


def predict(trace_or_run: Any, conf: str | AllocConf = "", gpu: str | GpuProfile | None = None, *,
            trace: Any = None) -> Prediction:
    """Replay a dry run (or any :class:`~allocconf_widget.app.sources.TraceSource`) under
    ``conf`` on ``gpu``: one row of the one replay
    (:func:`allocconf_widget.app.simulate.simulate`), on the decoded trace a
    :class:`DryRunResult` keeps, so calls for each slider position or batch size only replay;
    for a ``TraceSource`` pass its decoded ``trace`` (``app.trace_cache.TraceCache`` has it).

    Raises:
        AllocConfError: ``conf`` is not a valid setting, or ``gpu`` is not a known profile.
    """
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    run = trace_or_run.result if isinstance(trace_or_run, DryRunContext) else trace_or_run
    if run is None:
        raise RuntimeStateError("the dry run has not finished: predict after the `with` block")
    if isinstance(run, DryRunResult):
        target: GpuProfile | None = resolve_gpu(gpu)[0] if gpu is not None else run.gpu
        source, decoded = run.source(), run.decoded()
    else:  # a TraceSource (a recording): its own device unless a profile is named
        target = resolve_gpu(gpu)[0] if gpu is not None else None
        source, decoded = run, trace
    if target is not None:
        source = dataclasses.replace(source, device_total=target.total_bytes,
                                     non_pytorch_bytes=target.context_bytes)
    request = (SimulationRequest(configs=(conf,), workers=1) if not isinstance(conf, str)
               else SimulationRequest(confs=(conf,), workers=1))
    with warnings.catch_warnings():  # a slider position is not the place for advice (the panel has it)
        warnings.simplefilter("ignore", AllocConfWarning)
        # one setting: replayed in this process (a worker pool costs more than the replay)
        report = simulate(source, request, trace=decoded)
    row = report.rows[0]
    oom = row.result.oom
    return Prediction(row.conf, target.name if target is not None else "the recorded GPU",
                      row.result.peak_reserved_bytes, row.result.peak_allocated_bytes,
                      row.limit.bytes if row.limit is not None else 0, fits=row.outcome.fits is True,
                      oom_at_bytes=oom.requested_bytes if oom is not None and row.outcome.fits is False
                      else None, estimate=source.estimate, row=row)


# ---------------------------------------------------------------- batch planner

@dataclass(frozen=True)
class PlanCell:
    batch: int
    conf: str
    gpu: str
    prediction: Prediction | None  # None: the dry run itself failed at this size
    error: str | None = None


@dataclass(frozen=True)
class PlanStep:
    """Where a plan is: ``done`` of ``total`` dry runs (one per size and GPU), and the next one."""

    done: int
    total: int
    batch: int
    gpu: str


@dataclass(frozen=True)
class BatchPlan:
    """Largest batch predicted to fit, per setting and GPU (never touching the GPU)."""

    sizes: tuple[int, ...]
    confs: tuple[str, ...]
    gpus: tuple[str, ...]
    cells: tuple[PlanCell, ...]
    notes: tuple[str, ...] = ()
    #: GPUs on which every size gave the same allocations (the step does not use the size)
    same_trace: tuple[str, ...] = ()
    #: the size whose dry run a Ctrl-C stopped (the sizes before it are done), or None
    interrupted: int | None = None

    def cell(self, size: int, conf: str, gpu: str) -> PlanCell | None:
        return next((c for c in self.cells if c.batch == size and c.conf == conf and c.gpu == gpu), None)

    def largest(self, conf: str, gpu: str) -> int | None:
        """The largest size that fits such that every smaller tried size fits too."""
        best = None
        for size in self.sizes:
            cell = self.cell(size, conf, gpu)
            if cell is None or cell.prediction is None or not cell.prediction.fits:
                break
            best = size
        return best

    def all_fit(self, conf: str, gpu: str) -> bool:
        """Every size tried fits: the largest that fits lies beyond them."""
        return bool(self.sizes) and self.largest(conf, gpu) == self.sizes[-1] and self.interrupted is None

    def larger_sizes(self) -> tuple[int, int]:
        """Two sizes to try next when every size fits: twice and four times the largest."""
        top = self.sizes[-1] if self.sizes else 1
        return 2 * top, 4 * top


def _signature(run: DryRunResult) -> tuple[tuple[str, int], ...]:
    """The allocations a dry run made, in order (equal for two sizes: the step ignores the size)."""
    return tuple((e["action"], int(e["size"])) for e in run.trace.entries)


def plan_batch(step: Callable[[Any], Any], sizes: Iterable[int], *,
               confs: Sequence[str] = ("", "expandable_segments:True"),
               gpus: Sequence[str | GpuProfile] = ("t4",),
               prepare: Callable[[int], Any] | None = None, standin: bool | None = None,
               progress: Callable[[PlanStep], None] | None = None) -> BatchPlan:
    """Dry-run ``step(size)`` for each size and GPU, and replay each under every setting.

    ``step`` builds what it needs on "cuda" (model, optimizer, batch) and runs one step; it runs
    on fake tensors, so CUDA never starts. Each GPU is dry-run on its own: the attention kernel
    and the workspaces depend on the GPU. Sizes are tried in increasing order; once a size fails
    everywhere, larger ones are not tried. ``prepare(size)``, when given, runs first for each
    dry run, outside it, and ``step`` gets what it returns instead of the size (a copy of real
    tensors cannot be made on fake ones). ``progress`` hears of each dry run before it starts.
    A Ctrl-C stops the plan cleanly (each dry run puts everything back): the plan returned holds
    the sizes done and names the one interrupted.
    """
    order = tuple(sorted({int(s) for s in sizes}))
    if not order or order[0] <= 0:
        raise AllocConfError("batch sizes must be positive integers", fix="e.g. sizes=[8, 16, 32]")
    profiles = [resolve_gpu(g)[0] for g in gpus]
    cells: list[PlanCell] = []
    notes: list[str] = []
    signatures: dict[str, set[tuple[tuple[str, int], ...]]] = {p.name: set() for p in profiles}
    total, done = len(order) * len(profiles), 0
    tried: list[int] = []
    interrupted = None
    for size in order:
        size_fits = False
        try:
            for p in profiles:
                if progress is not None:
                    progress(PlanStep(done, total, size, p.name))
                done += 1
                given = prepare(size) if prepare is not None else size
                ctx = DryRunContext(p, standin=standin)
                try:
                    with ctx:
                        step(given)
                except RuntimeStateError as exc:
                    cells.extend(PlanCell(size, c, p.name, None, str(exc)) for c in confs)
                    continue
                run = ctx.result
                assert run is not None
                signatures[p.name].add(_signature(run))
                for note in run.all_notes():
                    if note not in notes:
                        notes.append(note)
                for conf in confs:
                    pred = predict(run, conf, p)
                    size_fits = size_fits or pred.fits
                    cells.append(PlanCell(size, conf, p.name, pred))
        except KeyboardInterrupt:
            interrupted = size
            cells = [c for c in cells if c.batch != size]
            break
        tried.append(size)
        if not size_fits and any(c.prediction is not None for c in cells if c.batch == size):
            break
    same = tuple(name for name, seen in signatures.items() if len(tried) > 1 and len(seen) == 1)
    return BatchPlan(tuple(tried), tuple(confs), tuple(p.name for p in profiles), tuple(cells), tuple(notes),
                     same, interrupted)


# ---------------------------------------------------------------- close the loop

#: the settings an estimate is checked under by default (those docs/dryrun.md measured)
CHECK_SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4")


@dataclass(frozen=True)
class EstimateRow:
    """One setting: the dry run's estimate beside the replay of the real recording."""

    conf: str
    estimated: int  # peak reserved predicted from the dry run
    recorded: int  # peak reserved of the recording replayed under the same setting

    @property
    def error(self) -> float:
        """(estimate − recording) / recording: negative when the dry run was low."""
        return (self.estimated - self.recorded) / self.recorded if self.recorded else 0.0


@dataclass(frozen=True)
class EstimateCheck:
    """How far a dry run's estimate was from the run recorded later, per setting."""

    rows: tuple[EstimateRow, ...]
    gpu: str

    @property
    def ranking_agrees(self) -> bool:
        """The settings rank the same by the estimate as by the recording."""
        def order(key: Callable[[EstimateRow], int]) -> list[str]:
            return [r.conf for r in sorted(self.rows, key=lambda r: (key(r), r.conf))]

        return order(lambda r: r.estimated) == order(lambda r: r.recorded)

    def worst(self) -> EstimateRow:
        return max(self.rows, key=lambda r: abs(r.error))


def compare_estimate(dry: DryRunResult, recording: TraceSource, confs: Sequence[str] = CHECK_SETTINGS,
                     *, trace: Any = None) -> EstimateCheck:
    """Each setting's peak reserved from the dry run beside the real recording's replay (the
    replay of a recorded trace is close to exact: docs/fidelity.md), on
    the recording's GPU. ``trace`` is the recording's decoded trace, if the caller has it.

    Raises:
        AllocConfError: a setting is not valid.
    """
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AllocConfWarning)
        report = simulate(recording, SimulationRequest(confs=tuple(confs)), trace=trace)
    return estimate_rows(dry, report)


def estimate_rows(dry: DryRunResult, report: SimulationReport) -> EstimateCheck:
    """The dry run's estimate for each row of a replay of the real recording (``report``: the
    What-if's ranking, or :func:`compare_estimate`'s), on the recording's GPU: the recorded
    peaks are the report's own, so nothing is replayed twice."""
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    total = report.device_total or dry.gpu.total_bytes
    usable = report.usable_bytes
    outside = total - usable if usable is not None else dry.gpu.context_bytes
    on_that_gpu = dataclasses.replace(dry.source(), device_total=total, non_pytorch_bytes=outside)
    confs = tuple(row.conf for row in report.rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AllocConfWarning)
        estimated = simulate(on_that_gpu, SimulationRequest(confs=confs), trace=dry.decoded())
    rows = tuple(EstimateRow(row.conf, estimate.result.peak_reserved_bytes, row.result.peak_reserved_bytes)
                 for row, estimate in zip(report.rows, estimated.rows, strict=True))
    return EstimateCheck(rows, "the recorded GPU")


def session_estimate(session: EstimateHolder, report: SimulationReport | None = None) -> EstimateCheck | None:
    """The session's dry run beside its later ``%%allocconf record``, per setting: the rows of
    ``report`` (the What-if's ranking of that recording) or :data:`CHECK_SETTINGS`. None when
    the session lacks either. Kept per (recording, dry run, settings) in the trace cache."""
    dry, recording = session.dry_run, session.recording
    if not isinstance(dry, DryRunResult) or recording is None or recording.snapshot is None:
        return None
    if report is not None:
        confs = tuple(row.conf for row in report.rows)
        return session.trace_cache.memo(session, ("estimate", confs),
                                        lambda _source, _trace: estimate_rows(dry, report))
    return session.trace_cache.memo(
        session, ("estimate", CHECK_SETTINGS),
        lambda source, trace: compare_estimate(dry, source, CHECK_SETTINGS, trace=trace))
