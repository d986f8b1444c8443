"""Build script for the optional compiled modules: the replay engine (``core.sim._replay``) and
the trace-entry check's inline path (``core.memory._entrycheck``).

Everything else about the package is in pyproject.toml. The extension is built on CPython's
limited API, so one ``cp310-abi3`` wheel serves every Python from 3.10 on; it is optional: where
no C compiler works (an sdist installed without a toolchain) the install goes on without it and
the package replays in Python, with the same answers (docs/simulator.md, "Two engines").
``ALLOCCONF_PURE=1`` builds the pure wheel on purpose.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel

PURE = os.environ.get("ALLOCCONF_PURE") == "1"


def _limited_api() -> bool:
    """The limited API needs CPython with the GIL (a free-threaded build has no abi3)."""
    import sysconfig

    return sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


class _Wheel(bdist_wheel):
    """Tag a wheel holding the extension ``cp310-abi3``; a pure one stays ``py3-none-any``."""

    def finalize_options(self) -> None:
        if not PURE and _limited_api():
            self.py_limited_api = "cp310"
        super().finalize_options()


ext_modules = [] if PURE else [
    Extension(
        name,
        sources=[source],
        py_limited_api=_limited_api(),
        define_macros=[("Py_LIMITED_API", "0x030A0000")] if _limited_api() else [],
        extra_compile_args=["-O2", "-std=c99"] if os.name != "nt" else [],
        optional=True,
    )
    for name, source in (("allocconf_widget.core.sim._replay", "allocconf_widget/core/sim/_replay.c"),
                         ("allocconf_widget.core.memory._entrycheck",
                          "allocconf_widget/core/memory/_entrycheck.c"))
]

setup(ext_modules=ext_modules, cmdclass={"bdist_wheel": _Wheel})
