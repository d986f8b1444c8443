"""``allocconf simulate TRACE``: replay a recorded allocator trace under other settings.

By default it ranks, as ``%allocconf simulate`` and the What-if tab do: a grid of
common settings, the recorded ones and each ``--conf``, best first, each with its
reason; the header gives the fidelity self-check (how many of the recorded segment
events a replay under the recorded settings reproduces). ``--no-rank`` replays only
each ``--conf``, in the order given, or without one the recorded settings (the
self-check's one row); ``--recommend`` asks for the default. ``--json``
prints a JSON array, one object per configuration, in the table's order.

Exit codes: 0 ok (also when an OOM is predicted), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from allocconf_widget._errors import AllocConfError, SnapshotError, one_line

_PROG = "allocconf simulate"


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to the top-level parser."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay a recorded allocation trace under other allocator settings",
        description=(
            "Replay the allocation history of a snapshot written after "
            "torch.cuda.memory._record_memory_history() through a model of PyTorch's caching "
            "allocator, and predict peak reserved memory, OOMs and retries under other "
            "PYTORCH_CUDA_ALLOC_CONF settings. Needs no GPU. See docs/simulator.md."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="snapshot .pickle (or .pickle.gz) with history")
    parser.add_argument("--torch-version", metavar="X.Y",
                        help="torch release that recorded the trace (default: the release whose "
                             "rules reproduce its segment events best, the installed torch on a tie; "
                             "a sidecar's torch where there is one)")
    parser.add_argument("--conf", action="append", metavar="C", default=None,
                        help="a setting to add to the ranking, e.g. expandable_segments:True "
                             "(repeatable; '' = torch defaults); with --no-rank, only these are "
                             "replayed")
    parser.add_argument("--device-total", metavar="BYTES",
                        help="GPU memory as torch reports it, e.g. 79.2GiB for an H100 80GB or "
                             "139.8GiB for an H200 (80GB reads as 80·10⁹ bytes, 74.51 GiB); default: "
                             "a sidecar's, else inferred from an OOM in the trace, else unlimited")
    parser.add_argument("--non-pytorch", metavar="BYTES", default=None,
                        help="memory used outside PyTorch's allocator (CUDA context, libraries), "
                             "e.g. 600MiB; default: a sidecar's, else estimated from the trace when "
                             "the device's memory is known")
    parser.add_argument("--fraction", type=float, metavar="F",
                        help="torch.cuda.set_per_process_memory_fraction(F) in force (default: "
                             "the recording's sidecar's; else the limit the trace's OOMs show, "
                             "where the device still had room)")
    parser.add_argument("--device", type=int, metavar="N", help="CUDA device whose trace to use")
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument("--rank", action=argparse.BooleanOptionalAction, default=True,
                        help="rank a grid of common settings, the recorded ones and each --conf, as "
                             "%%allocconf simulate does (the default); --no-rank replays only each "
                             "--conf, or without one the recorded settings (the self-check)")
    parser.add_argument("--recommend", dest="rank", action="store_const", const=True,
                        help="the same as the default (--rank)")
    parser.add_argument("--continue-after-oom", action="store_true",
                        help="keep replaying after a predicted OOM instead of stopping there")
    parser.add_argument("--workers", type=int, metavar="N", help="processes to use (default: all cores)")
    parser.set_defaults(handler=run)


class _BadInputError(Exception):
    """Input problem: message goes to stderr, exit code 2."""


def _fail(message: str) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return 2


def _note(message: str) -> None:
    print(f"{_PROG}: note: {one_line(message)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Load, replay, print; returns the exit code."""
    try:
        return _run(args)
    except _BadInputError as exc:
        return _fail(str(exc))


def _run(args: argparse.Namespace) -> int:
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import SourceOptions
    from allocconf_widget.core.versions import installed_torch_version
    from allocconf_widget.views.text.simulate import render_simulation, report_json

    path = Path(args.trace)
    if args.workers is not None and args.workers < 1:
        raise _BadInputError(f"--workers {args.workers} is not a number of processes; give 1 or "
                             "more (default: all cores)")
    try:
        options = SourceOptions.parse(torch_version=args.torch_version, device_total=args.device_total,
                                      non_pytorch=args.non_pytorch, device=args.device)
    except AllocConfError as exc:
        raise _BadInputError(str(exc)) from None
    progress = _Progress.on_a_terminal(sys.stderr)
    try:
        if progress is not None:
            progress.say(f"reading {one_line(path.name, 120)}")
        source = options.file(str(path))
        if progress is not None:
            progress.say("replaying")
        report = simulate(source, SimulationRequest(
            confs=tuple(args.conf or ()), rank=args.rank,
            fraction=float(args.fraction) if args.fraction is not None else None,
            continue_after_oom=args.continue_after_oom, workers=args.workers,
            # no kernel here: rows are offered for the torch installed beside this command
            offer_release=installed_torch_version(), progress=progress))
    except SnapshotError as exc:
        raise _BadInputError(f"{one_line(str(path), 300)}: {exc}") from None
    except AllocConfError as exc:
        raise _BadInputError(str(exc)) from None
    finally:
        if progress is not None:
            progress.clear()
    if report.version_note:
        _note(f"{report.version_note}; pass --torch-version to override")
    for note in report.notes:
        _note(note.text)
    if args.json:
        json.dump(report_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_simulation(report))
    return 0


class _Progress:
    """How far the load and the replays have got, on one line of a terminal's stderr, rewritten
    as each setting's replays finish and wiped before the report: a 1M-event trace with frees
    that wait on other streams takes about ten seconds under eight settings, silent before.
    Only on a terminal: a log or a pipe keeps no carriage returns."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    @classmethod
    def on_a_terminal(cls, stream: TextIO) -> _Progress | None:
        try:
            return cls(stream) if stream.isatty() else None
        except (AttributeError, ValueError, OSError):  # a closed or replaced stderr
            return None

    def say(self, what: str) -> None:
        from allocconf_widget.views.text.simulate import progress_line

        self.stream.write(f"\r\033[K{progress_line(what)}")
        self.stream.flush()
        self.shown = True

    def __call__(self, done: int, total: int) -> None:
        """The use case's progress callback: ``done`` of ``total`` settings replayed."""
        from allocconf_widget.views.text.simulate import replay_count

        self.say(replay_count(done, total))

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
