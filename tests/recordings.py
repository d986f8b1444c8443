"""Recorded runs in ``tests/data`` as the tests use them: loaded by path, drawn as a timeline.

The product loads only the bundled recording (``load_demo``) and a snapshot's sidecar
(``sidecar_facts``); replaying one into the monitor is ``adapters/replay.ReplaySampler``'s job,
at the pace of a clock. Tests want the whole run at once, so these two helpers live here.
"""

from __future__ import annotations

import json
from pathlib import Path

from allocconf_widget.core.memory.recording import Recording, recording_from_dict
from allocconf_widget.core.memory.timeline import Timeline

DATA = Path(__file__).resolve().parent / "data"


def load_recording(json_path: Path) -> Recording:
    """``<name>.json`` of ``tests/data`` with its ``<name>.pickle.gz`` snapshot beside it."""
    snapshot = json_path.with_name(json_path.name.removesuffix(".json") + ".pickle.gz")
    meta = json.loads(json_path.read_text(encoding="utf-8"))
    return recording_from_dict(meta, json_path.stem, snapshot if snapshot.exists() else None)


def timeline_of(rec: Recording) -> Timeline:
    """The whole run in a timeline: every sample (with the non-PyTorch share and fragmentation)
    and every optimizer step, as the monitor's replay ends up drawing it."""
    timeline = Timeline()
    non_pytorch = rec.non_pytorch_bytes
    for sample, frag in zip(rec.samples, rec.fragmentation(), strict=True):
        values = sample.values()
        values["non_pytorch"] = None if non_pytorch is None else float(non_pytorch)
        values["fragmentation"] = frag
        timeline.add(sample.t, values, 0)
    for step in rec.steps:
        timeline.step(step.t, step.step)
    return timeline
