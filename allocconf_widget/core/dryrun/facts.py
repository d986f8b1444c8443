"""What every front end says about a dry-run trace: its label and what it cannot see.

Kept in the core (standard library, no logic) so the replay's file reader
(``app/sources.file_source``) and the dry run itself (``app/dryrun``) say the same thing
without importing each other. docs/dryrun.md has the measurements behind the wording.
"""

from __future__ import annotations

#: how a dry run's trace is labelled wherever it is replayed
LABEL = "dry run (estimate)"

#: how an estimate made by the CPU stand-in (no GPU, a training step) is labelled beside that
STANDIN_LABEL = "by the CPU stand-in (a coarser estimate)"

#: the key a dry run's snapshot carries (plain data: the GPU profile, torch, op count), so a
#: saved file is labelled an estimate wherever it is replayed
SNAPSHOT_MARK = "allocconf_dry_run"

#: what every dry-run prediction lacks, for the notes beside it
GAPS = (
    "a dry run (estimate): fake CUDA tensors, no GPU; it adds cuBLAS's and cuDNN's workspaces "
    "(convolutions, attention) by rules measured on an H200 (other GPUs choose other "
    "algorithms), and cannot see other kernels' temporary buffers; the self-check has no real "
    "segments to compare with",
    "code that depends on tensor values (.item() gave 1.0, data-dependent shapes) may take "
    "another path on the GPU",
)
