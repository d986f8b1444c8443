"""Front-end detection and the restart paths that cannot run for real here.

Colab's front end does not exist on this machine: its detection is fed the
module/environment markers Colab's kernel has (notebook.md §9), and its
restart path is checked with the process kill replaced by a recorder — the one
mock in this suite, because killing the test process is not an option. The
JupyterLab restart path is exercised for real in tests/e2e/test_restart_browser.py.
"""

from __future__ import annotations

import signal
import time

from allocconf_widget.adapters.frontend import Frontend, detect_frontend, restart


def test_detects_colab_from_its_module_or_environment():
    assert detect_frontend({}, {"google.colab": object()}) is Frontend.COLAB
    assert detect_frontend({"COLAB_RELEASE_TAG": "release-colab_20261101"}, {}) is Frontend.COLAB


def test_detects_vscode_before_jupyter():
    assert detect_frontend({"VSCODE_PID": "123", "JPY_SESSION_NAME": "x.ipynb"}, {}) is Frontend.VSCODE


def test_plain_python_without_ipython():
    assert detect_frontend({}, {}) is Frontend.PLAIN


def test_colab_restart_ends_the_process_shortly_after_answering():
    kills = []
    outcome = restart(Frontend.COLAB, _kill=lambda pid, sig: kills.append((pid, sig)))
    assert outcome.started and outcome.how == "os.kill"
    assert "Colab" in outcome.message
    time.sleep(0.8)  # the kill is delayed so the message reaches the page first
    assert len(kills) == 1 and kills[0][1] == signal.SIGKILL


def test_vscode_and_terminal_only_explain():
    vscode = restart(Frontend.VSCODE)
    assert not vscode.started and "toolbar" in vscode.message
    terminal = restart(Frontend.TERMINAL)
    assert not terminal.started and "%load_ext allocconf_widget" in terminal.message
