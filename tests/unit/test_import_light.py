"""``import allocconf_widget`` must stay cheap and must not touch torch or the notebook stack."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "plotly", "ipywidgets", "IPython", "numpy", "pynvml", "anywidget")


def _modules_after(code: str) -> list[str]:
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_pulls_no_heavy_dependency():
    loaded = _modules_after("import allocconf_widget")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_parsing_a_config_pulls_no_heavy_dependency_either():
    loaded = _modules_after("import allocconf_widget as a; a.parse_conf('expandable_segments:True', '2.11')")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
