"""Settings survive a real kernel restart (jupyter_client + ipykernel, no mocks).

Environment variables die with a kernel; the saved settings file brings them
back when the new kernel runs ``%load_ext allocconf_widget``, before torch is
imported, with one line saying so.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


def test_apply_restart_load_ext_restores_before_torch(kernel):
    kernel.execute("%load_ext allocconf_widget").check()
    out, _, err = kernel.execute("%allocconf set expandable_segments=True max_split_size_mb=512\n"
                                 "%allocconf apply")
    assert err is None, out
    kernel.restart()
    out, _, err = kernel.execute("import os, sys; print(os.environ.get('PYTORCH_ALLOC_CONF'))")
    assert err is None and out.strip() == "None"  # a restart loses the environment
    out, _, err = kernel.execute("%load_ext allocconf_widget")
    assert err is None
    assert out.count("\n") == 1 and "re-applied saved settings" in out
    assert "expandable_segments:True,max_split_size_mb:512" in out
    out, _, _ = kernel.execute("print('torch' in sys.modules, os.environ.get('PYTORCH_ALLOC_CONF'))")
    assert out.strip() == "False expandable_segments:True,max_split_size_mb:512"


def test_corrupt_settings_file_warns_and_the_kernel_lives(kernel, xdg_config_home):
    path = xdg_config_home / "allocconf_widget" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "conf": "max_split_size_mb=128"}')
    out, _, err = kernel.execute("%load_ext allocconf_widget")
    assert err is None
    assert "ignoring saved settings" in out and "%allocconf forget" in out
    out, result, err = kernel.execute("import os; os.environ.get('PYTORCH_ALLOC_CONF')")
    assert err is None and result is None  # nothing applied
    out, _, err = kernel.execute("%allocconf forget")
    assert err is None and "Removed" in out


def test_forget_means_a_fresh_kernel_starts_from_defaults(kernel):
    kernel.execute("%load_ext allocconf_widget\n%allocconf set expandable_segments=True\n"
                   "%allocconf apply\n%allocconf forget").check()
    kernel.restart()
    out, _, err = kernel.execute("%load_ext allocconf_widget\nimport os\n"
                                 "print(os.environ.get('PYTORCH_ALLOC_CONF'))")
    assert err is None and out.strip() == "None"
