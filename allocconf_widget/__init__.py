"""allocconf_widget: see, tune and trust PyTorch's CUDA caching-allocator settings.

Importing the package is cheap on purpose: it loads only the pure configuration
model (standard library). torch, IPython, ipywidgets and plotly are imported
by the functions that need them, so ``import allocconf_widget`` never
initialises CUDA and never freezes the allocator configuration.
"""

from __future__ import annotations

from typing import Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning, SnapshotError
from allocconf_widget._version import __version__

__all__ = [
    "AllocConf",
    "AllocConfError",
    "AllocConfWarning",
    "SnapshotError",
    "__version__",
    "dry_run",
    "load_ipython_extension",
    "parse_conf",
    "rank_reporter",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    # parse_conf/AllocConf resolve on first use so that even the (small) schema
    # tables are only built when someone asks for them.
    if name in ("parse_conf", "AllocConf"):
        import importlib

        return getattr(importlib.import_module("allocconf_widget.core.config.conf"), name)
    raise AttributeError(f"module 'allocconf_widget' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """Entry point for ``%load_ext allocconf_widget``."""
    from allocconf_widget.views.magic.extension import load_extension

    load_extension(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Entry point for ``%unload_ext allocconf_widget``."""
    from allocconf_widget.views.magic.extension import unload_extension

    unload_extension(ipython)


def rank_reporter(rank: int | None = None, *, interval: float = 0.5,
                  devices: list[int] | None = None) -> Any:
    """Report this process's allocator to the notebook that launched it (call it in each rank).

    Does nothing and returns None unless the notebook opened its rank channel
    (``%allocconf ranks open``) before launching this process; otherwise starts a
    daemon thread writing this rank's figures every ``interval`` seconds and
    returns it. It never initialises CUDA: until the rank uses the GPU it reports
    "waiting". ``rank`` defaults to ``RANK`` / ``LOCAL_RANK`` from the launcher.
    """
    from allocconf_widget.adapters.rank_channel import start_reporter

    return start_reporter(rank=rank, interval=interval, devices=devices)


def dry_run(gpu: Any = None, *, rules: bool = True, standin: bool | None = None,
            progress: bool = True) -> Any:
    """Predict a step's GPU memory before CUDA starts: ``with allocconf_widget.dry_run() as run:``.

    The block runs on fake CUDA tensors (no GPU memory, CUDA never starts, so every allocator
    setting stays open); afterwards ``run.predict("expandable_segments:True")``,
    ``run.save("step.pickle")`` (``allocconf simulate`` replays it). ``gpu``: ``"t4"``,
    ``"l4"``, ``"a100-40"``, ``"a100-80"``, ``"h100"``, ``"h200"``, or None for this runtime's
    GPU. Where no GPU is visible the step runs on the CPU stand-in, labelled the coarser
    estimate it is (``standin=False`` forces fake CUDA tensors: inference only there).
    ``progress``: show the ops dispatched while a long block runs. See docs/dryrun.md.
    """
    from allocconf_widget.views.python.dryrun import dry_run as start

    return start(gpu, rules=rules, standin=standin, progress=progress)
