"""Settings survive a real kernel restart (jupyter_client + ipykernel, no mocks).

Environment variables die with a kernel; the saved settings file brings them
back when the new kernel runs ``%load_ext allocconf_widget``, before torch is
imported, with one line saying so.
"""

from __future__ import annotations

import pytest

from tests.torch_versions import OPT, OPT_NAME, OPT_SET, OPT_VALUES, READ_VAR, TWO_OPTS, offered

pytestmark = pytest.mark.kernel


def test_apply_restart_load_ext_restores_before_torch(kernel):
    kernel.execute("%load_ext allocconf_widget").check()
    out, _, err = kernel.execute(f"%allocconf set {TWO_OPTS.replace(':', '=').replace(',', ' ')}\n"
                                 "%allocconf apply")
    assert err is None, out
    kernel.restart()
    out, _, err = kernel.execute(f"import os, sys; print(os.environ.get({READ_VAR!r}))")
    assert err is None and out.strip() == "None"  # a restart loses the environment
    out, _, err = kernel.execute("%load_ext allocconf_widget")
    assert err is None
    assert out.count("\n") == 1 and f"re-applied '{TWO_OPTS}'" in out
    assert "from this project's saved settings" in out and "no variable was set before" in out
    out, _, _ = kernel.execute(f"print('torch' in sys.modules, os.environ.get({READ_VAR!r}))")
    assert out.strip() == f"False {TWO_OPTS}"


def test_corrupt_global_settings_file_warns_and_the_kernel_lives(kernel, xdg_config_home):
    path = xdg_config_home / "allocconf_widget" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "conf": "max_split_size_mb=128"}')
    out, _, err = kernel.execute("%load_ext allocconf_widget")
    assert err is None
    assert out.count("\n") == 1
    assert "ignoring saved settings" in out and "%allocconf forget --global" in out
    out, result, err = kernel.execute(f"import os; os.environ.get({READ_VAR!r})")
    assert err is None and result is None  # nothing applied
    out, _, err = kernel.execute("%allocconf forget --global")
    assert err is None and "Removed the global default" in out


def test_forget_means_a_fresh_kernel_starts_from_defaults(kernel):
    kernel.execute(f"%load_ext allocconf_widget\n%allocconf set {OPT_SET}\n"
                   "%allocconf apply\n%allocconf forget").check()
    kernel.restart()
    out, _, err = kernel.execute("%load_ext allocconf_widget\nimport os\n"
                                 f"print(os.environ.get({READ_VAR!r}))")
    assert err is None
    line, value = out.strip().splitlines()
    assert value == "None"
    assert "no saved settings" in line and "torch's defaults apply" in line


def test_settings_saved_in_one_project_do_not_follow_into_another(kernel_factory):
    first = kernel_factory()  # each kernel runs in its own folder: two projects
    first.execute(f"%load_ext allocconf_widget\n%allocconf set {OPT_SET}\n"
                  "%allocconf apply").check()
    other = kernel_factory()
    out, _, err = other.execute("%load_ext allocconf_widget\nimport os\n"
                                f"print(os.environ.get({READ_VAR!r}))")
    assert err is None
    line, value = out.strip().splitlines()
    assert value == "None" and "no saved settings" in line
    # a global default is what a project without its own settings gets
    other.execute("%allocconf set garbage_collection_threshold=0.7\n%allocconf apply --no-save\n"
                  "%allocconf apply --global").check()
    third = kernel_factory()
    out, _, err = third.execute("%load_ext allocconf_widget")
    assert err is None and out.count("\n") == 1
    assert "re-applied 'garbage_collection_threshold:0.7'" in out and "the global default in" in out
    first.restart()  # the first project keeps its own
    out, _, _ = first.execute("%load_ext allocconf_widget")
    assert f"re-applied '{OPT}'" in out and "this project's" in out
    # a global default saved there says at once that this project's own file wins here
    out, _, err = first.execute("%allocconf set garbage_collection_threshold=0.5\n"
                                "%allocconf apply --global")
    assert err is None and "but this project has settings of its own" in out, out


def test_a_variable_the_user_exported_is_replaced_only_by_project_settings_and_the_line_says_so(
        kernel_factory):
    exported = {READ_VAR: "max_split_size_mb:128"}
    k = kernel_factory(extra_env=exported)
    k.execute(f"%load_ext allocconf_widget\n%allocconf set {OPT_SET} --replace\n"
              "%allocconf apply --no-save\n%allocconf apply --global").check()
    k.restart()
    out, _, err = k.execute("%load_ext allocconf_widget\nimport os\n"
                            f"print(os.environ.get({READ_VAR!r}))")
    assert err is None
    line, value = out.strip().splitlines()
    assert value == "max_split_size_mb:128"  # a global default never overrides an export
    assert f"kept {READ_VAR}='max_split_size_mb:128' exported" in line
    assert OPT in line and "was not applied" in line
    k.execute(f"%allocconf set {OPT_SET} --replace\n%allocconf apply").check()
    k.restart()
    out, _, err = k.execute("%load_ext allocconf_widget\nimport os\n"
                            f"print(os.environ.get({READ_VAR!r}))")
    line, value = out.strip().splitlines()
    assert value == OPT
    assert f"re-applied '{OPT}'" in line
    assert f"replacing {READ_VAR}='max_split_size_mb:128' exported before the kernel started" in line


def test_restart_saves_what_was_applied_never_staged_edits(kernel):
    kernel.execute(f"%load_ext allocconf_widget\n%allocconf set {OPT_SET}\n"
                   "%allocconf apply\nimport torch\n"
                   "%allocconf set garbage_collection_threshold=0.7").check()
    out, _, err = kernel.execute("from allocconf_widget.app.session import get_session\n"
                                 "print(get_session().settings_for_restart().to_string())")
    assert err is None and out.strip() == OPT


def _complete(kernel, code: str) -> list[str]:
    """A ``complete_request`` as JupyterLab sends it on Tab, answered by the real kernel."""
    msg_id = kernel.client.complete(code, len(code))
    while True:
        reply = kernel.client.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return list(reply["content"]["matches"])


def test_tab_completion_through_the_kernel_offers_only_our_words(kernel):
    kernel.execute("%load_ext allocconf_widget").check()
    assert offered(_complete(kernel, "%allocconf se"), ["set"])
    assert offered(_complete(kernel, "%allocconf set garbage_coll"), ["garbage_collection_threshold="])
    assert offered(_complete(kernel, f"%allocconf set {OPT_NAME}="), OPT_VALUES)
    assert offered(sorted(_complete(kernel, "%allocconf monitor --de")), ["--demo", "--device"])
    assert "print" in _complete(kernel, "pri")  # Python completion is untouched elsewhere
