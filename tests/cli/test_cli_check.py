"""The ``allocconf check`` and ``options`` commands, run as a user would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torch_versions import READ_VAR

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    return subprocess.run([sys.executable, "-m", "allocconf_widget", *args], capture_output=True,
                          text=True, env={**base, **(env or {})}, cwd=ROOT, check=False)


def test_check_valid_prints_canonical_string_and_warnings():
    out = cli("check", "max_split_size_mb:128 , expandable_segments:True", "--torch-version", "2.11")
    assert out.returncode == 0
    assert out.stdout.strip() == "expandable_segments:True,max_split_size_mb:128"
    assert "123548" in out.stderr  # the split + expandable trap
    assert "export PYTORCH_ALLOC_CONF='expandable_segments:True,max_split_size_mb:128'" in out.stderr


def test_check_invalid_exits_2_with_the_fix():
    out = cli("check", "max_split_size_mb=128", "--torch-version", "2.11")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "Fix: write max_split_size_mb:128" in out.stderr


@pytest.mark.parametrize(("version", "says"), [
    ("2.15", "without IPC handles: a CUDA tensor in one cannot be sent to another process"),
    ("2.9", "not read by torch 2.9")])
def test_check_env_says_what_the_expandable_segments_ipc_variable_does(version, says):
    env = {"TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC": "0"}
    out = cli("check", "--env", "--torch-version", version, env=env)
    assert out.returncode == 0
    prefix = "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC='0': "
    line = next(x for x in out.stdout.splitlines() if x.startswith(prefix))
    assert says in line
    doc = json.loads(cli("check", "--env", "--json", "--torch-version", version, env=env).stdout)
    assert doc["related"][0]["name"] == "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"
    assert says in doc["related"][0]["meaning"]


def test_check_json_both_ways():
    ok = json.loads(cli("check", "expandable_segments:True", "--json", "--torch-version", "2.9").stdout)
    assert ok == {"valid": True, "conf": "expandable_segments:True", "torch_version": "2.9",
                  "variable": "PYTORCH_CUDA_ALLOC_CONF", "warnings": []}
    bad = cli("check", "expandable_segments:yes", "--json", "--torch-version", "2.11")
    assert bad.returncode == 2
    err = json.loads(bad.stdout)
    assert err["valid"] is False and err["option"] == "expandable_segments" and err["position"] == 20


def test_check_env_names_the_replay_engine_in_use():
    from allocconf_widget.core.sim import native

    chosen = cli("check", "--env", "--torch-version", "2.11")
    assert f"replay engine: {native.describe_engine()}" in chosen.stdout.splitlines()
    forced = cli("check", "--env", "--json", env={**os.environ, native.ENGINE_VARIABLE: "python"})
    doc = json.loads(forced.stdout)
    assert doc["replay_engine"] == "python"
    assert doc["replay_engine_detail"] == f"python ({native.ENGINE_VARIABLE}=python)"


def test_check_env_reports_ignored_variable():
    out = cli("check", "--env", "--torch-version", "2.9",
              env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert out.returncode == 0
    assert "silently ignored" in out.stderr


def test_bad_torch_version_is_a_usage_error():
    out = cli("check", "", "--torch-version", "banana")
    assert out.returncode == 2 and "not a torch version" in out.stderr


@pytest.mark.parametrize("version", ["1.13", "2.9", "2.15"])
def test_options_table_lists_exactly_the_release_keys(version):
    rows = json.loads(cli("options", "--torch-version", version, "--json").stdout)["options"]
    names = [r["option"] for r in rows]
    assert ("expandable_segments" in names) == (version != "1.13")
    assert ("roundup_bypass_threshold_mb" in names) == (version == "1.13")
    assert ("expandable_segments_reserve" in names) == (version == "2.15")
    text = cli("options", "--torch-version", version).stdout
    assert all(name in text for name in names)


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("allocconf")
    if not exe.exists():
        pytest.skip("package not installed with its console script in this environment")
    out = subprocess.run([str(exe), "check", "expandable_segments:True", "--torch-version", "2.11"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "expandable_segments:True"


def test_docs_options_page_is_generated_from_the_code():
    generated = cli("options", "--markdown").stdout
    committed = (ROOT / "docs" / "options.md").read_text()
    assert committed == generated, "run: python -m allocconf_widget options --markdown > docs/options.md"


def test_check_env_catches_an_invalid_hip_variable_holding_the_generic_keys():
    env = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    env.update(PYTORCH_HIP_ALLOC_CONF="max_split_size_mb:5", PYTORCH_ALLOC_CONF="expandable_segments:True")
    done = cli("check", "--env", "--torch-version", "2.11", env=env)
    assert done.returncode == 2
    assert "PYTORCH_HIP_ALLOC_CONF='max_split_size_mb:5' is not valid" in done.stderr


@pytest.mark.parametrize("args", [
    ("check", "expandable_segments:True", "--torch-version", "2." + "1" * 4400),
    ("check", "max_split_size_mb:" + "9" * 5000),
    ("simulate", "tests/data/streams__default.pickle.gz", "--device-total", "9" * 400),
])
def test_huge_numbers_are_a_message_not_a_traceback(args):
    done = cli(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error" in done.stderr
    assert len(done.stderr) < 3000


def test_a_pasted_variable_name_is_dropped_with_a_note():
    done = cli("check", "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'",
               "--torch-version", "2.11")
    assert done.returncode == 0 and done.stdout.strip() == "expandable_segments:True"
    assert "dropped the variable name PYTORCH_CUDA_ALLOC_CONF=" in done.stderr


def test_an_empty_string_says_unset_not_export_empty():
    done = cli("check", "")
    assert done.returncode == 0
    assert f"unset {READ_VAR}" in done.stderr and "export" not in done.stderr.split("Do not")[0]


def test_the_common_paste_without_export_and_an_unknown_name_get_help():
    done = cli("check", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "--torch-version", "2.11")
    assert done.returncode == 0 and done.stdout.strip() == "expandable_segments:True"
    assert "dropped the variable name PYTORCH_CUDA_ALLOC_CONF=" in done.stderr
    typo = cli("check", "max_split_size:128")
    assert typo.returncode == 2 and "did you mean max_split_size_mb?" in typo.stderr


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_options_fits_the_terminal_width(columns):
    done = cli("options", "--torch-version", "2.13", env={"COLUMNS": str(columns)})
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    rows = json.loads(cli("options", "--torch-version", "2.13", "--json").stdout)["options"]
    assert all(r["option"] in done.stdout.split() for r in rows)  # names are never cut
    wide = cli("options", "--torch-version", "2.13", "--width", "250").stdout
    assert "OPTION" in wide and max(len(line) for line in wide.splitlines()) <= 250
