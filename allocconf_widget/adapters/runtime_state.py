"""Where the process stands with torch and its allocator, found out without changing it.

The phases, in the order a session moves through them:

``NOT_IMPORTED``  torch is not in ``sys.modules``: every option, ``backend``
                  included, can still be set through the environment.
``IMPORTED``      torch is imported, CUDA and the allocator are not up. ``backend``
                  is fixed. The other options are *probably* still open, but a
                  call such as ``memory_snapshot()`` freezes them without any
                  flag showing it (measured on torch 2.11), so we apply through
                  torch's runtime setter, which works whether or not that happened.
``LIVE``          CUDA (or the allocator) is initialised: the environment is no
                  longer read; only the runtime setter changes settings.
``NO_CUDA``       torch is a CPU-only build: nothing will read the settings in
                  this process.

Looking never imports torch, never initialises CUDA and never parses the
allocator configuration: only calls measured to be side-effect free are used
(``is_initialized``, ``_accelerator_isAllocatorInitialized``,
``_cuda_getAllocatorBackend``), and GPU names come from NVML.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from allocconf_widget.adapters import nvml, torch_private
from allocconf_widget.core.config.envvars import EnvReport, check_environment
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.versions import TorchVersion, default_version, installed_torch_version


class Phase(enum.Enum):
    """How far the process has gone towards reading the allocator settings."""

    NOT_IMPORTED = "torch not imported yet"
    IMPORTED = "torch imported, CUDA not started"
    LIVE = "CUDA allocator running"
    NO_CUDA = "torch has no CUDA in this build"


@dataclass(frozen=True)
class RuntimeState:
    """A snapshot of the runtime facts that decide how a setting can be applied."""

    phase: Phase
    torch_version: TorchVersion | None
    cuda_initialized: bool
    allocator_initialized: bool | None
    backend: str | None
    can_set_live: bool
    env: EnvReport
    gpus: tuple[nvml.GpuInfo, ...] | None

    @property
    def version(self) -> TorchVersion:
        """The release to validate against: the running/installed torch, else the newest modelled."""
        return self.torch_version or default_version()

    def describe(self) -> str:
        """One line for banners and ``%allocconf show``."""
        torch_text = f"torch {self.torch_version}" if self.torch_version else "torch not installed"
        parts = [torch_text, self.phase.value]
        if self.backend:
            parts.append(f"backend {self.backend}")
        if self.gpus:
            gpu = self.gpus[0]
            more = f" (+{len(self.gpus) - 1} more)" if len(self.gpus) > 1 else ""
            parts.append(f"{gpu.name}, {format_bytes(gpu.total_bytes)}{more}")
        elif self.gpus is not None:
            parts.append("no GPU visible to NVML")
        return " · ".join(parts)


def detect_state(environ: dict[str, str] | None = None) -> RuntimeState:
    """Look at the process and return its :class:`RuntimeState`; changes nothing."""
    environ = dict(os.environ) if environ is None else environ
    torch = torch_private.imported_torch()
    version = installed_torch_version()
    found = nvml.gpus()
    gpus = tuple(found) if found is not None else None
    env = check_environment(environ, version or default_version())
    if torch is None:
        return RuntimeState(Phase.NOT_IMPORTED, version, False, None, None, False, env, gpus)
    can_set = torch_private.has_setter(torch)
    if not torch_private.cuda_built(torch):
        return RuntimeState(Phase.NO_CUDA, version, False, None, None, can_set, env, gpus)
    cuda_up = torch_private.cuda_initialized(torch)
    alloc_up = torch_private.allocator_initialized(torch)
    phase = Phase.LIVE if cuda_up or alloc_up else Phase.IMPORTED
    backend = torch_private.load_time_backend(torch)
    return RuntimeState(phase, version, cuda_up, alloc_up, backend, can_set, env, gpus)
