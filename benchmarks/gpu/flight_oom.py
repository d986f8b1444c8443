"""Real OOMs for the flight recorder: one a setting avoids, one no setting avoids.

Each run is one fresh process (the allocator starts empty), with the flight
recorder turned on *before* CUDA starts (so it arms and must start itself), a
per-process memory fraction as the limit, and optionally the live monitor's
sampler running. It prints one ``RESULT {json}`` line; with ``--save`` it also
writes the capture as demo data (``<name>.json`` + ``<name>.pickle.gz``).

Workloads (``--workload``):

``fragment``  every step allocates a 190 MiB activation, frees the previous one,
              and keeps a 100 MiB output that lands in the freed segment: under
              torch's defaults each segment stays pinned by its output, reserved
              grows ~1.9x faster than allocated and the fraction is hit at ~half
              use. Expandable segments (or not splitting big blocks) avoid it.
``nofix``     keeps 256 MiB tensors until the limit: everything is allocated,
              nothing is cached, and no setting can help.

``--rerun-conf C`` runs the same workload in this process with
``PYTORCH_CUDA_ALLOC_CONF=C`` set before ``import torch`` and reports whether it
ran out of memory (the GPU test uses it to check the verdict's pick).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout, no install

MIB = 1 << 20
LIMIT_BYTES = 4 << 30


def activations(size_mib: int) -> object:  # named for the sites table
    import torch

    return torch.empty(size_mib * MIB, dtype=torch.uint8, device="cuda")


def kept_output(size_mib: int) -> object:
    import torch

    return torch.empty(size_mib * MIB, dtype=torch.uint8, device="cuda")


def fragment(steps: int = 30) -> list[object]:
    kept: list[object] = []
    held: list[object] = []
    for _ in range(steps):
        held.append(activations(190))
        if len(held) > 1:
            del held[0]  # the previous step's activations are freed after this step's exist
        kept.append(kept_output(100))
        time.sleep(0.002)  # lets a running monitor sample between steps
    return kept


def nofix(steps: int = 40) -> list[object]:
    return [kept_output(256) for _ in range(steps)]


WORKLOADS = {"fragment": fragment, "nofix": nofix}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="fragment")
    parser.add_argument("--stacks", action="store_true")
    parser.add_argument("--monitor", action="store_true", help="run the live sampler meanwhile")
    parser.add_argument("--rerun-conf", metavar="CONF")
    parser.add_argument("--conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF for this run")
    parser.add_argument("--save", metavar="DIR")
    parser.add_argument("--name", default="flight_oom_h200")
    args = parser.parse_args()
    conf = args.rerun_conf if args.rerun_conf is not None else args.conf
    if conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf

    from allocconf_widget.adapters.flight_history import flight_history
    from allocconf_widget.app import flight

    out: dict[str, object] = {"workload": args.workload, "conf": conf or ""}
    if args.rerun_conf is None:
        armed = flight.turn_on(python_stacks=args.stacks)  # before import torch: arms
        out["status_before_torch"] = armed.line
    import torch

    out["status_after_import"] = flight.status().line
    total = torch.cuda.mem_get_info(0)[1]  # initialises CUDA: the recorder starts here
    fraction = LIMIT_BYTES / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    out["status_live"] = flight.status().line
    out["torch"] = torch.__version__
    sampler = None
    if args.monitor:
        from allocconf_widget.adapters.sampler import Sampler

        sampler = Sampler(interval=0.01).start()
    started = time.perf_counter()
    error = None
    try:
        WORKLOADS[args.workload]()
    except torch.OutOfMemoryError as exc:
        error = str(exc)
    out["wall_s"] = round(time.perf_counter() - started, 3)
    if sampler is not None:
        sampler.stop()
        out["monitor_samples"] = sampler.overhead().get("samples")
    out["oom"] = error is not None
    out["oom_message"] = (error or "")[:400]
    out["peak_reserved"] = torch.cuda.memory_stats().get("reserved_bytes.all.peak")
    if args.rerun_conf is not None:
        print("RESULT " + json.dumps(out))
        return
    capture = flight_history().last_capture()
    out["captured"] = capture is not None
    out["capture_errors"] = flight_history().capture_errors
    if capture is not None:
        analysis = flight.analyse(capture)
        v = analysis.verdict
        out.update(events=capture.events, snapshot_s=round(capture.seconds, 4),
                   fraction_calls=capture.snapshot.get("allocconf_fraction_changes"),
                   fraction=capture.fraction, limit=capture.limit,
                   sites_by=analysis.sites.by, sites=[s.label for s in analysis.sites.sites[:4]],
                   verdict=v.headline if v else analysis.verdict_error,
                   winner=v.winner.conf if v and v.winner else None,
                   winners=[o.conf for o in v.winners] if v else [],
                   sure=v.sureness.startswith("sure:") if v else None, sureness=v.sureness if v else None)
        if args.save:
            folder = Path(args.save)
            folder.mkdir(parents=True, exist_ok=True)
            meta = {
                "name": args.name,
                "description": f"'{args.workload}' workload on an {torch.cuda.get_device_name(0)} "
                               f"with torch {torch.__version__}, memory fraction limit "
                               f"{LIMIT_BYTES >> 30} GiB, flight recorder on "
                               f"({capture.settings.describe()})",
                "workload": args.workload, "torch": torch.__version__,
                "device": capture.device, "requested": capture.requested, "limit": capture.limit,
                "device_free": capture.device_free, "device_total": capture.device_total,
                "fraction": capture.fraction, "stats": capture.stats,
                "max_entries": capture.settings.max_entries,
                "python_stacks": capture.settings.python_stacks, "when": capture.when,
                "snapshot_s": capture.seconds, "at": capture.at, "oom": error,
                "verdict": out.get("verdict"), "winner": out.get("winner"),
            }
            (folder / f"{args.name}.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
            with gzip.open(folder / f"{args.name}.pickle.gz", "wb") as handle:
                pickle.dump(capture.snapshot, handle, protocol=4)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
