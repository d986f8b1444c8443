"""In VS Code's notebooks the panel falls back to text with a one-line reason, as in a terminal.

VS Code cannot run on this machine: these kernels are real, and only VS Code's markers are
faked, the ones its notebooks give a kernel (``VSCODE_PID`` / ``VSCODE_CWD`` in the
environment, ``__vsc_ipynb_file__`` in the namespace where the kernel runs remotely). VS Code
draws the widget panel as nothing (ipywidgets 8.1.9) or hangs on it (7.7), so no widget may be
displayed there.
"""

from __future__ import annotations

import pytest

from tests.kernel.kernels import RealKernel
from tests.torch_versions import OPT_NAME

pytestmark = pytest.mark.kernel

WIDGET = "application/vnd.jupyter.widget-view+json"


def _no_widget_shown(kernel: RealKernel, code: str) -> str:
    done = kernel.execute(code, timeout=120)
    done.check()
    assert not any(WIDGET in data for data in done.displays), done.displays
    return done.stdout


@pytest.mark.parametrize("marker", ["environment", "namespace"])
def test_the_panel_is_text_with_the_reason(kernel_factory, marker: str) -> None:
    if marker == "environment":
        kernel = kernel_factory(extra_env={"VSCODE_PID": "4242", "VSCODE_CWD": "/home/u"})
        setup = ""
    else:
        kernel = kernel_factory(extra_env={"JPY_SESSION_NAME": "train.ipynb"})
        setup = "__vsc_ipynb_file__ = '/home/u/train.ipynb'\n"
    out = _no_widget_shown(kernel, f"{setup}%load_ext allocconf_widget\n%allocconf")
    reason = next(line for line in out.splitlines() if line.startswith("No widgets in VS Code"))
    assert "#17504" in reason and "%allocconf set" in reason
    assert OPT_NAME in out  # the options of the installed torch, as the text panel lists them


def test_the_monitor_and_the_ranks_view_are_text_too(kernel_factory) -> None:
    kernel = kernel_factory(extra_env={"VSCODE_PID": "4242"})
    out = _no_widget_shown(kernel, "%load_ext allocconf_widget\n%allocconf monitor start --demo\n"
                           "%allocconf monitor stop\n%allocconf ranks watch\n%allocconf ranks close")
    assert out.count("No widgets in VS Code") == 2
    assert "monitor stopped" in out
