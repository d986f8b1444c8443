"""Every ``%allocconf`` subcommand and error path, in IPython's own test shell.

The shell is the real InteractiveShell (``IPython.testing.globalipapp``);
torch is the real CPU build, imported only by the tests that need it.
Tests that must see "torch not imported" run in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from allocconf_widget.adapters import persist
from tests.torch_versions import (
    OPT,
    OPT_NAME,
    OPT_SET,
    OPT_VALUES,
    READ_VAR,
    TORCH,
    TORCH_TEXT,
    has_torch,
    needs_torch,
    offered,
)


def magic(ip, line: str, capsys):
    result = ip.run_line_magic("allocconf", f"-r {line}")
    return result, capsys.readouterr().out


def _in_a_fresh_interpreter(tmp_path: Path, code: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a new interpreter, as a new kernel starts: no allocator variable but
    ``variables``, settings under ``tmp_path``; it must succeed."""
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env.update(variables, XDG_CONFIG_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_results_are_returned_only_on_request(ip, capsys):
    assert ip.run_line_magic("allocconf", f"set {OPT_SET}") is None
    staged = ip.run_line_magic("allocconf", f"-r set {OPT_SET}")
    assert staged.to_string() == OPT


def test_help_comes_from_the_parser(ip):
    doc = ip.find_line_magic("allocconf").__doc__
    for sub in ("show", "set", "apply", "reset", "forget", "snippet", "restart"):
        assert sub in doc


def test_set_pairs_stage_and_validate(ip, capsys):
    import torch  # noqa: F401 - after import, set only stages

    staged, out = magic(ip, "set max_split_size_mb=256 roundup_power2_divisions=4", capsys)
    assert staged.to_string() == "max_split_size_mb:256,roundup_power2_divisions:4"
    assert "Run %allocconf apply" in out
    assert READ_VAR not in os.environ  # staged, not applied


def test_set_whole_string_and_unset(ip, capsys):
    magic(ip, f'set "{OPT},garbage_collection_threshold:0.6"', capsys)
    staged, _ = magic(ip, "unset garbage_collection_threshold", capsys)
    assert staged.to_string() == OPT
    staged, _ = magic(ip, f"set {OPT_NAME}=default", capsys)
    assert staged.to_string() == ""


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("set max_split_size_mb=8", "too small"),
        pytest.param("set expandable_segments=true", "expandable_segments:True",
                     marks=needs_torch((2, 1), "a boolean option (expandable_segments)")),
        ("set max_split_mb=50", "did you mean max_split_size_mb"),
        ("set nonsense", "not key=value"),
        ("bogus", "invalid choice"),
        ("set", "required"),
    ],
)
def test_bad_input_is_a_usage_error_and_changes_nothing(ip, capsys, line, message):
    before_env = dict(os.environ)
    from allocconf_widget.app.session import get_session

    before = get_session(ip).staged()
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("allocconf", line)
    assert dict(os.environ) == before_env
    assert get_session(ip).staged() == before


def test_apply_writes_environment_and_saves(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    result, out = magic(ip, "apply", capsys)
    assert os.environ[result.variable] == OPT
    assert "Saved for this project to" in out
    assert persist.load().conf.to_string() == OPT


def test_apply_no_save(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    magic(ip, "apply --no-save", capsys)
    assert persist.load() is None


def test_reset_stages_defaults_and_can_apply(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    magic(ip, "apply", capsys)
    staged, _ = magic(ip, "reset", capsys)
    assert staged.to_string() == ""
    magic(ip, "reset --apply", capsys)
    assert READ_VAR not in os.environ


def test_forget(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    magic(ip, "apply", capsys)
    removed, out = magic(ip, "forget", capsys)
    assert removed is True and "Removed" in out
    assert persist.load() is None


def test_snippet_uses_the_variable_of_the_installed_torch(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    snips, out = magic(ip, "snippet", capsys)
    assert snips["magic"] == f"%env {READ_VAR}={OPT}"  # the variable this torch reads
    assert f"export {READ_VAR}='{OPT}'" in out


def test_show_reports_state_requested_and_saved(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    magic(ip, "apply", capsys)
    info, out = magic(ip, "show", capsys)
    assert "Runtime:" in out and f"torch {TORCH_TEXT}" in out
    assert f"Requested: {OPT}" in out
    assert "Saved:" in out and "this project's saved settings" in out and "projects" in out
    assert info["readback"] is None  # no GPU: nothing live to read back
    if info["state"].phase.name == "NO_CUDA":  # a CPU build: it never will be readable
        assert "Effective: none: this torch build has no CUDA" in out
        assert "not readable yet" not in out
    else:  # torch not imported yet, or a CUDA build without a GPU here
        assert "Effective: not readable yet" in out


@pytest.mark.parametrize(("value", "says"), [
    ("0", "without IPC handles"), ("1", "can be sent to other processes"),
    ("yes", "Ignoring invalid value for boolean flag")])
def test_show_says_what_the_expandable_segments_ipc_variable_does(ip, capsys, monkeypatch, value, says):
    monkeypatch.setenv("TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC", value)
    _, out = magic(ip, "show", capsys)
    line = next(x for x in out.splitlines() if "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC" in x)
    if TORCH is not None and TORCH < (2, 10):  # this torch does not read it
        assert "not read by torch" in line
    else:
        assert says in line


def test_show_on_a_cpu_build_says_no_allocator_reads_the_settings(ip, capsys):
    if not _cpu_build():
        pytest.skip("needs a CPU-only torch build (the CUDA builds of the torch cells are not)")
    ip.run_cell("import torch")
    _, out = magic(ip, "show", capsys)
    assert "Effective: none: this torch build has no CUDA" in out


def test_restart_in_a_terminal_shell_only_explains(ip, capsys):
    magic(ip, f"set {OPT_SET}", capsys)
    magic(ip, "apply", capsys)
    outcome, out = magic(ip, "restart", capsys)
    assert outcome.restart.started is False  # never kills a terminal session
    assert persist.load().conf.to_string() == OPT
    assert "Quit this IPython" in out


@needs_torch((2, 0), "the backend option")
def test_restart_saves_the_complete_applied_conf_with_backend_not_staged_edits(ip, capsys):
    """Restart saves what was applied, backend included (on CUDA builds the environment lacks it:
    tests/gpu/test_lifecycle_gpu.py), and never the staged edits."""
    import torch  # noqa: F401 - after import a backend change waits for the restart

    magic(ip, f"set backend=cudaMallocAsync {OPT_SET}", capsys)
    magic(ip, "apply", capsys)
    magic(ip, "set garbage_collection_threshold=0.7", capsys)  # staged, never applied
    _, out = magic(ip, "restart", capsys)
    assert persist.load().conf.to_string() == f"backend:cudaMallocAsync,{OPT}"
    assert "never applied are not carried over" in out


@needs_torch((2, 2), "release_lock_on_cudamalloc")
def test_apply_then_panel_state_keeps_every_applied_option(ip, capsys):
    """After apply, the session's one view shows what was applied and no pending change."""
    import torch  # noqa: F401

    from allocconf_widget.app.session import get_session

    magic(ip, "set release_lock_on_cudamalloc=True", capsys)
    magic(ip, "apply", capsys)
    view = get_session(ip).view()
    assert view.staged.get("release_lock_on_cudamalloc") is True
    assert view.applied == view.staged and not view.has_changes and view.plans == ()


@pytest.mark.parametrize(("line", "message"), [
    ("set garbage_collection_threshold=0.6,backend:cudaMallocAsync", "uses .=. between option and value"),
    ("unset max_split_size", "did you mean max_split_size_mb"),
    ("set max_split_size=default", "did you mean max_split_size_mb"),
    ("set =5", "option name is missing"),
    ("set :", "option name is missing"),
    ("set ''", "nothing to set"),
    ("set garbage_collection_threshold=1e-310", "subnormal"),
    ("set garbage_collection_threshold=1e99999", "too large for a double"),
    (f"set {OPT_SET}\u00a0", r"U\+00A0 no-break space"),
])
def test_hostile_set_lines_are_usage_errors_and_change_nothing(ip, capsys, line, message):
    import torch  # noqa: F401

    from allocconf_widget.app.session import get_session

    magic(ip, "set max_split_size_mb=256", capsys)
    before, env = get_session(ip).staged(), dict(os.environ)
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("allocconf", line)
    assert get_session(ip).staged() == before
    assert dict(os.environ) == env


@pytest.mark.parametrize("prefix", ["%env", "export"])
def test_a_pasted_env_or_export_line_sets_its_value(ip, capsys, prefix):
    """``set %env PYTORCH_CUDA_ALLOC_CONF=…`` (a line pasted from a blog post) suggested
    "write %env=<value>"; the leading word is dropped as the variable's name is."""
    staged, out = magic(ip, f"set {prefix} PYTORCH_CUDA_ALLOC_CONF={OPT}", capsys)
    assert staged.to_string() == OPT and "dropped the variable name PYTORCH_CUDA_ALLOC_CONF=" in out, out


def test_an_option_given_twice_is_said_not_silently_resolved(ip, capsys):
    """In one string torch takes the last value (a warning says so); as two ``k=v`` words it is
    a slip, refused with nothing changed."""
    from allocconf_widget.app.session import get_session

    _, out = magic(ip, "set max_split_size_mb:512,roundup_power2_divisions:4,max_split_size_mb:256", capsys)
    assert "warning: max_split_size_mb is given twice" in out and "torch uses the last one" in out, out
    before = get_session(ip).staged()
    with pytest.raises(UsageError, match=r"max_split_size_mb is given twice \(128 and 1024\)"):
        ip.run_line_magic("allocconf", "set max_split_size_mb=128 max_split_size_mb=1024")
    assert get_session(ip).staged() == before


def test_an_interrupted_line_magic_says_one_line(ip, monkeypatch):
    """The kernel's interrupt during ``%allocconf simulate`` printed a dozen frames of ours (the
    CLI says one line): a ``UsageError`` naming the command stops the cell instead."""
    from pathlib import Path

    import allocconf_widget.app.simulate as app_simulate

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(app_simulate, "simulate", interrupted)
    trace = Path(__file__).resolve().parents[1] / "data" / "cnn__default.pickle.gz"
    with pytest.raises(UsageError, match=r"^%allocconf simulate interrupted$"):
        ip.run_line_magic("allocconf", f"simulate {trace}")


def test_an_interrupt_before_the_handler_or_while_loading_says_one_line(ip, monkeypatch):
    """A Ctrl-C while the magic builds its parser (each call does), or while ``%load_ext``
    re-applies the saved settings, gave a traceback through our code."""
    from allocconf_widget.views.magic import core as magic_core
    from allocconf_widget.views.magic import extension

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(extension, "build_parser", interrupted)
    with pytest.raises(UsageError, match=r"^%allocconf interrupted$"):
        ip.run_line_magic("allocconf", "show")
    monkeypatch.undo()
    monkeypatch.setattr(magic_core, "restore_saved_settings", interrupted)
    monkeypatch.setitem(extension.LOAD_STATE, "loaded_before", False)
    with pytest.raises(UsageError, match="loading was interrupted; run %load_ext allocconf_widget again"):
        extension.load_extension(ip)


def test_panel_in_terminal_prints_text(ip, capsys):
    panel, out = magic(ip, "", capsys)
    assert panel is None
    assert "max_split_size_mb" in out and "default (unset)" in out
    assert "unset (torch's defaults)" in out and "=''" not in out  # no variable is not ''


def test_the_terminal_panel_marks_a_staged_draft_as_the_widget_panel_does(ip, capsys):
    """With torch imported ``set`` only stages: ``show`` said so, while the text panel printed
    the draft as the variable, with no "(after Apply)" as the widget panel has."""
    import torch  # noqa: F401  (imported: set stages instead of writing the environment)

    magic(ip, f"set {OPT_SET}", capsys)
    _, out = magic(ip, "", capsys)
    assert f"={OPT!r} (after Apply)" in out, out


def test_cell_magic_refuses_line_only_subcommands(ip):
    with pytest.raises(UsageError, match="does not take a cell body"):
        ip.run_cell_magic("allocconf", "show", "x = 1")


def test_unload_removes_the_magic(ip):
    assert ip.find_line_magic("allocconf") is not None
    ip.run_line_magic("unload_ext", "allocconf_widget")
    assert ip.find_line_magic("allocconf") is None
    ip.run_line_magic("load_ext", "allocconf_widget")
    assert ip.find_line_magic("allocconf") is not None


def test_reloading_the_extension_keeps_what_was_set_and_unloading_disarms_the_recorder(tmp_path):
    """``%reload_ext`` re-applied the saved settings over a value set since (and called it
    "exported before the kernel started"); ``%unload_ext`` left the flight recorder's import
    watcher armed with no magic to stop it. In a fresh interpreter, as a kernel is."""
    code = textwrap.dedent("""
        import os, sys
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set roundup_power2_divisions=4")
        ip.run_line_magic("allocconf", "apply")
        ip.run_line_magic("allocconf", "set garbage_collection_threshold=0.6")
        before = {k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}
        print("<<<")
        ip.run_line_magic("reload_ext", "allocconf_widget")
        print(">>>")
        after = {k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}
        print("KEPT", before == after, after)
        ip.run_line_magic("allocconf", "flight on")
        ip.run_line_magic("unload_ext", "allocconf_widget")
        print("WATCHERS", [type(f).__name__ for f in sys.meta_path if "allocconf" in type(f).__module__])
    """)
    done = _in_a_fresh_interpreter(tmp_path, code)
    out = done.stdout
    assert "KEPT True" in out and "garbage_collection_threshold:0.6" in out, out[-2000:]
    said = out.split("<<<\n", 1)[1].split(">>>", 1)[0]
    assert said.startswith("allocconf_widget: loaded again in this kernel; ") and said.count("\n") == 1, said
    assert "garbage_collection_threshold:0.6" in said and "before the kernel started" not in said, said
    assert "WATCHERS []" in out, out[-2000:]


def test_reset_before_import_torch_says_it_removed_the_variable_and_discard_claims_nothing(tmp_path):
    """Before ``import torch``, ``reset`` removes the variable at once (as ``set`` writes it) but
    said only "Staged", and ``discard`` then said "dropped" while nothing came back; unsetting
    the last option said ``PYTORCH_ALLOC_CONF='' set`` for a variable that was removed."""
    code = textwrap.dedent("""
        import os
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set roundup_power2_divisions=4")
        print("<<<")
        ip.run_line_magic("allocconf", "reset")
        print("ENV", sorted(k for k in os.environ if k.endswith("ALLOC_CONF")))
        ip.run_line_magic("allocconf", "discard")
        ip.run_line_magic("allocconf", "set max_split_size_mb=256")
        ip.run_line_magic("allocconf", "set --replace max_split_size_mb=default")
    """)
    done = _in_a_fresh_interpreter(tmp_path, code)
    lines = done.stdout.split("<<<\n", 1)[1].splitlines()
    assert lines[0].endswith("removed from the environment: torch's defaults apply when CUDA starts "
                             "(%allocconf apply also saves that for kernel restarts)."), lines
    assert lines[1] == "ENV []" and lines[2].startswith("Nothing staged to drop"), lines
    assert lines[-1].endswith("removed from the environment: torch's defaults apply when CUDA starts "
                              "(%allocconf apply also saves that for kernel restarts)."), lines
    assert "Staged torch's defaults" not in done.stdout and "=''" not in done.stdout


def test_an_invalid_exported_variable_is_called_invalid_at_load_and_when_set_drops_it(tmp_path):
    """``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb=128`` (``=`` for ``:``) was said to "apply" at
    load, and a later ``set`` replaced it without a word about the option it dropped."""
    code = textwrap.dedent("""
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set roundup_power2_divisions=4")
        ip.run_line_magic("allocconf", "set garbage_collection_threshold=0.5")
    """)
    done = _in_a_fresh_interpreter(tmp_path, code, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb=128")
    load, note, *rest = done.stdout.splitlines()
    assert "from the environment applies, but it is not valid: " in load
    assert "write max_split_size_mb:128" in load
    assert note == ("note: PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb=128' was not valid, so none of it "
                    "was kept; set its options again (with ':' or '=' here) if you want them"), note
    assert not any(line.startswith("note:") for line in rest), rest  # said once: the variable is valid now


def test_two_valid_variables_are_not_called_invalid(tmp_path):
    """Only a value torch would reject is "not valid": two valid variables (one shadowing the
    other) draw neither the load line's warning nor the note of a dropped value."""
    code = textwrap.dedent("""
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set garbage_collection_threshold=0.5")
    """)
    done = _in_a_fresh_interpreter(tmp_path, code, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128",
                                   PYTORCH_ALLOC_CONF="max_split_size_mb:256")
    assert "not valid" not in done.stdout and "none of it was kept" not in done.stdout, done.stdout


def test_with_both_variables_set_the_lines_name_what_torch_reads_and_what_went(tmp_path):
    """Both variables exported: the load line said both "applied" (torch reads one), and
    ``unset`` of the last option removed each variable torch reads but named only one."""
    code = textwrap.dedent("""
        import os
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        before = {k for k in os.environ if k.endswith("ALLOC_CONF")}
        ip.run_line_magic("allocconf", "unset max_split_size_mb")
        print("GONE", ",".join(sorted(before - {k for k in os.environ if k.endswith("ALLOC_CONF")})))
    """)
    done = _in_a_fresh_interpreter(tmp_path, code, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:256",
                                   PYTORCH_ALLOC_CONF="max_split_size_mb:512")
    lines = done.stdout.splitlines()
    load, gone = lines[0], lines[-1]
    said = next(line for line in lines if "removed from the environment" in line)
    assert "from the environment applies, but PYTORCH_ALLOC_CONF is " in load, load  # not read, or
    # read only from 2.10 (before it, torch ignores the generic name)
    removed = gone.removeprefix("GONE ").split(",")
    named = said.split(" removed from the environment", 1)[0]
    assert removed[0] and sorted(named.split(" and ")) == removed, (said, removed)


def test_a_variable_set_by_hand_between_two_sets_is_said_to_leave_the_other_unread(tmp_path):
    """``set`` wrote one variable; the user then ran ``%env`` for the other; the next ``set``
    printed only its own line, and the first setting went unread without a word."""
    code = textwrap.dedent("""
        import os
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set roundup_power2_divisions=4")
        other = "PYTORCH_CUDA_ALLOC_CONF" if "PYTORCH_ALLOC_CONF" in os.environ else "PYTORCH_ALLOC_CONF"
        os.environ[other] = "max_split_size_mb:256"  # what %env does
        print("<<<")
        ip.run_line_magic("allocconf", "set garbage_collection_threshold=0.6")
    """)
    done = _in_a_fresh_interpreter(tmp_path, code)
    said = done.stdout.split("<<<\n", 1)[1]
    assert "note: PYTORCH_ALLOC_CONF " in said, said


def test_set_before_import_torch_just_works_in_a_fresh_interpreter(tmp_path):
    second, canonical = (
        (OPT_SET, f"{OPT},max_split_size_mb:256") if OPT_NAME != "max_split_size_mb"
        else ("roundup_power2_divisions=4", "max_split_size_mb:256,roundup_power2_divisions:4"))
    code = textwrap.dedent(f"""
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "set max_split_size_mb=256 {second}")
        import os, sys
        assert "torch" not in sys.modules
        import torch
        print("ENV", os.environ.get("{READ_VAR}"))
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)  # torch 2.10+
        print("TORCH", getter() if getter else "(no getter)")
        from allocconf_widget.core.versions import installed_torch_version
        print("SEEN", installed_torch_version(), torch.__file__,
              {{k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}}, sys.path[:4])
    """)
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert f"ENV {canonical}" in out, out[-2000:]  # with what the child saw (its SEEN line)
    # torch parsed exactly that string when it first looked (where it can say so)
    assert f"TORCH {canonical}" in out or "TORCH (no getter)" in out


def test_forget_that_cannot_delete_is_a_usage_error(ip, xdg_config_home):
    target = persist.settings_path()
    (target / "inside").mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(UsageError, match="cannot be removed"):
        ip.run_line_magic("allocconf", "forget")
    assert target.is_dir()


def test_forget_with_a_file_where_the_config_folder_should_be_says_nothing_was_saved(ip, capsys,
                                                                                    xdg_config_home):
    xdg_config_home.mkdir(parents=True, exist_ok=True)
    (xdg_config_home / "allocconf_widget").write_text("not a folder")
    _, out = magic(ip, "forget", capsys)
    assert out.startswith("Nothing was saved as this project's saved settings"), out


@pytest.mark.parametrize(("line", "message"), [
    ("apply --no-save --global", "--no-save and --global contradict each other"),
    ("monitor --interval nan", "interval nan is not a number of seconds"),
])
def test_contradictory_or_meaningless_options_are_refused(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("allocconf", line)


# ----------------------------------------------------------------- conveniences


def _completions(ip, line: str) -> list[str]:
    """What Jupyter's kernel offers at the end of ``line`` (IPython's completions API)."""
    from IPython.core.completer import provisionalcompleter

    with provisionalcompleter():
        return [c.text for c in ip.Completer.completions(line, len(line))]


def test_tab_completes_subcommands_options_and_values_in_a_real_shell(ip):
    assert {"set", "apply", "monitor", "simulate", "restart"} <= set(_completions(ip, "%allocconf "))
    assert offered(_completions(ip, "%allocconf se"), ["set"])
    assert offered(_completions(ip, "%allocconf set max_sp"), ["max_split_size_mb="])
    assert offered(_completions(ip, f"%allocconf set {OPT_NAME}="), OPT_VALUES)
    assert offered(_completions(ip, "%allocconf unset garb"), ["garbage_collection_threshold"])
    assert offered(_completions(ip, "%allocconf monitor --r"), ["--renderer"])
    assert set(_completions(ip, "%allocconf monitor ")) >= {"start", "stop", "status", "--demo"}
    assert offered(_completions(ip, "%allocconf apply --g"), ["--global"])
    assert offered(_completions(ip, "%%allocconf rec"), ["record"])
    assert "print" in _completions(ip, "pri")  # other lines complete as before


def test_windows_paths_keep_their_backslashes(ip, capsys):
    from allocconf_widget.views.magic.completion import split_args

    assert split_args(r'simulate C:\traces\a.pickle "C:\my traces\b.pickle"') == [
        "simulate", r"C:\traces\a.pickle", r"C:\my traces\b.pickle"]
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("allocconf", r"simulate C:\traces\a.pickle")
    assert repr(r"C:\traces\a.pickle") in str(caught.value)  # not C:tracesa.pickle


def test_an_unclosed_quote_is_said_in_one_line_and_stages_nothing(ip, capsys):
    from allocconf_widget.app.session import get_session

    before = get_session(ip).staged()
    for line in ('set "expandable_segments=True', "simulate 'C:\\traces\\my run.pickle"):
        with pytest.raises(UsageError, match="is never closed"):
            ip.run_line_magic("allocconf", line)
    assert get_session(ip).staged() == before


def test_a_pasted_variable_assignment_is_staged_as_its_value(ip, capsys):
    staged, out = magic(ip, f"set PYTORCH_CUDA_ALLOC_CONF={OPT}", capsys)
    assert staged.to_string() == OPT
    assert "dropped the variable name PYTORCH_CUDA_ALLOC_CONF=" in out
    with pytest.raises(UsageError, match="did you mean max_split_size_mb"):
        ip.run_line_magic("allocconf", "set max_split_size=128")


def _cpu_build() -> bool:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.version.cuda is None


def test_an_error_nobody_foresaw_is_one_line_as_the_cli_says_it(ip, monkeypatch):
    """Fault injection: a replay failing in a way no check names (a hostile file's shape).
    The magic raised it with a full traceback where the CLI printed one line."""
    from allocconf_widget.app import simulate as use_case

    def broken(*_args, **_kwargs):
        raise KeyError(386856262853142088175845376)

    monkeypatch.setattr(use_case, "simulate", broken)
    monkeypatch.delenv("ALLOCCONF_DEBUG", raising=False)
    with pytest.raises(UsageError, match=r"could not be processed \(KeyError: 3868.*ALLOCCONF_DEBUG=1"):
        ip.run_line_magic("allocconf", "simulate --demo")
    monkeypatch.setenv("ALLOCCONF_DEBUG", "1")
    with pytest.raises(KeyError):
        ip.run_line_magic("allocconf", "simulate --demo")


def test_help_is_a_word_too(ip, capsys):
    """``%allocconf help`` was "invalid choice: 'help'"; only -h and ``%allocconf?`` worked."""
    ip.run_line_magic("allocconf", "help")
    assert "SUBCOMMAND" in capsys.readouterr().out
    ip.run_line_magic("allocconf", "help simulate")
    assert "--conf" in capsys.readouterr().out
    ip.run_line_magic("allocconf", "help help")
    assert "SUBCOMMAND" in capsys.readouterr().out


def test_set_names_every_problem_at_once_and_a_failed_paste_replaces_nothing(ip, capsys):
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    capsys.readouterr()
    with pytest.raises(UsageError, match=r"2 problems: \(1\) unknown option 'expandable_segment'.*"
                                         r"\(2\) garbage_collection_threshold=1.2 is too large"):
        ip.run_line_magic("allocconf", "set expandable_segment=true garbage_collection_threshold=1.2")
    with pytest.raises(UsageError):
        ip.run_line_magic("allocconf", "set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:abc")
    assert "replacing the staged" not in capsys.readouterr().out  # it replaced nothing
    from allocconf_widget.app.session import get_session

    assert get_session(ip).staged().to_string() == "max_split_size_mb:256"


def test_simulate_ranks_the_staged_draft_as_the_tab_does(ip, capsys):
    from allocconf_widget.app.session import get_session
    from allocconf_widget.core.config.conf import parse_conf

    session = get_session(ip)
    session.stage(parse_conf("roundup_power2_divisions:2", session.state().version, warn=False),
                  eager=False)
    capsys.readouterr()
    ip.run_line_magic("allocconf", "simulate --demo")
    assert "roundup_power2_divisions:2 [staged draft]" in capsys.readouterr().out


@pytest.mark.parametrize("sep", [":", "="])
def test_set_quotes_a_bad_value_as_it_was_typed(ip, sep):
    """A bad value is quoted with the separator typed; the fix example keeps it too."""
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("allocconf", f"set max_split_size_mb{sep}-5")
    assert str(info.value).startswith(f"max_split_size_mb{sep}-5 is negative")
    with pytest.raises(UsageError, match=f"give it once, e.g. max_split_size_mb{sep}512"):
        ip.run_line_magic("allocconf", f"set max_split_size_mb{sep}256 max_split_size_mb{sep}512")

@pytest.mark.parametrize("pasted", ["max_split_size_mb=128,expandable_segments:true",
                                    "garbage_collection_threshold=0.6,max_split_size_mb=128"])
def test_a_pasted_blog_string_gets_the_same_message_as_allocconf_check(ip, capsys, pasted):
    """A blog's string with '=' between option and value, quoted whole: the magic said a value
    "contains ','", while `allocconf check` named the '=' and its fix. One message for both."""
    check = subprocess.run([sys.executable, "-m", "allocconf_widget", "check", pasted],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode != 0
    said_by_check = check.stderr.strip().removeprefix("error: ")
    assert "uses '=' between option and value" in said_by_check, said_by_check
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("allocconf", f'set "{pasted}"')
    assert str(raised.value) == said_by_check
    from allocconf_widget.app.session import get_session

    assert get_session(ip).staged().to_string() == ""  # nothing staged
    if has_torch((2, 0)):  # a ',' inside brackets is part of one value (list form: 2.0+)
        staged, _ = magic(ip, "set roundup_power2_divisions=[256:1,512:2,>:8]", capsys)
        assert staged.to_string().startswith("roundup_power2_divisions:[256:1,512:2,>:8]")
