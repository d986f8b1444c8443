"""Front-end detection and the restart paths that cannot run for real here.

Colab's front end does not exist on this machine: its detection is fed the
module/environment markers Colab's kernel has (docs/internals/notebook_facts.md §9), and its
restart path is checked with the process kill replaced by a recorder — the one
mock in this suite, because killing the test process is not an option. The
JupyterLab and Notebook 7 restart path is exercised for real in tests/browser/test_restart_browser.py.
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


# ----------------------------------------------------------------- a server that refuses the restart


class _Server:
    """A real HTTP server on 127.0.0.1 answering like a token-less Jupyter server with XSRF on:
    GET /api/kernels/<id> works, every POST is refused with 403."""

    def __init__(self, kernel: str) -> None:
        import http.server
        import json as _json
        import threading

        posts: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = _json.dumps({"id": kernel}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                posts.append(self.path)
                self.send_error(403, "'_xsrf' argument missing from POST")

            def log_message(self, *args: object) -> None:
                pass

        self.posts = posts
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_refused_restart_request_falls_back_at_once_and_says_why(monkeypatch):
    from allocconf_widget.adapters import frontend

    server = _Server("k-1")
    kills = []
    monkeypatch.setattr(frontend, "_kernel_id", lambda: "k-1")
    monkeypatch.setattr(frontend, "_servers", lambda: [{"url": server.url, "token": ""}])
    # the kernel object is what cannot exist outside a kernel: the test shell only needs one
    monkeypatch.setattr(frontend, "_shell", lambda _modules=None: type("S", (), {"kernel": object()})())
    notes: list[str] = []
    try:
        started = time.monotonic()
        outcome = restart(Frontend.JUPYTER, _kill=lambda _pid, sig: kills.append(sig),
                          notify=notes.append)
        took = time.monotonic() - started
    finally:
        server.close()
    # asked about a kernel no server runs: a refusal restarts nothing, a 404 would say "go ahead"
    assert server.posts == ["/api/kernels/00000000-0000-0000-0000-000000000000/interrupt"]
    assert took < 1.0  # a refusal is seen in milliseconds, not at the next cell
    assert outcome.started and outcome.how.startswith("self (server refused: HTTP 403")
    assert "refused the restart request (HTTP 403" in outcome.message
    assert "XSRF" in outcome.message and "ends now" in outcome.message
    assert notes == ["Asking the Jupyter server to restart this kernel…"]
    time.sleep(0.8)
    assert kills == [signal.SIGKILL]  # ended at once: the server's restarter starts a new one


def test_download_links_point_at_the_servers_files_url(monkeypatch, tmp_path):
    from allocconf_widget.adapters import frontend

    target = tmp_path / "nb" / "allocconf-exports" / "a b.csv"
    monkeypatch.setattr(frontend, "_servers",
                        lambda: [{"root_dir": str(tmp_path / "other"), "base_url": "/"},
                                 {"root_dir": str(tmp_path), "base_url": "/user/x/"}])
    link = frontend.download_link(target, Frontend.JUPYTER)
    assert link.url == "/user/x/files/nb/allocconf-exports/a%20b.csv"
    assert frontend.download_link(target, Frontend.TERMINAL).url is None
    # Colab's files.download cannot run here (no google.colab): the link says so, no crash
    colab = frontend.download_link(target, Frontend.COLAB)
    assert colab.url is None and "download not started" in (colab.note or "")


def test_only_front_ends_that_draw_them_show_widgets():
    """The views ask this one property (not a tuple of front ends) before building widgets;
    VS Code's notebooks do not draw them."""
    assert {f for f in Frontend if not f.shows_widgets} == {Frontend.TERMINAL, Frontend.PLAIN,
                                                            Frontend.VSCODE}
    assert detect_frontend({}, modules={}).shows_widgets is False  # plain Python: text only



class _Shell:
    """A kernel's shell as VS Code's notebooks leave it: the notebook's path in the namespace."""

    kernel = object()

    def __init__(self, user_ns: dict[str, object]) -> None:
        self.user_ns = user_ns


class _IPython:
    def __init__(self, shell: _Shell) -> None:
        self.shell = shell

    def get_ipython(self) -> _Shell:
        return self.shell


def test_detects_vscode_from_its_notebook_marker_without_its_variables():
    """In WSL, over SSH or in a container the kernel has no VSCODE_PID; VS Code still puts
    ``__vsc_ipynb_file__`` in the namespace (faked here: VS Code cannot run on this machine)."""
    vscode = _IPython(_Shell({"__vsc_ipynb_file__": "/home/u/train.ipynb"}))
    assert detect_frontend({"JPY_SESSION_NAME": "train.ipynb"}, {"IPython": vscode}) is Frontend.VSCODE
    lab = _IPython(_Shell({}))
    assert detect_frontend({"JPY_SESSION_NAME": "train.ipynb"}, {"IPython": lab}) is Frontend.JUPYTER


def test_vscode_gets_text_with_a_one_line_reason():
    assert not Frontend.VSCODE.shows_widgets
    why = Frontend.VSCODE.why_no_widgets
    assert why is not None and "\n" not in why
    assert "VS Code" in why and "#17504" in why and "#17231" in why
    assert Frontend.TERMINAL.why_no_widgets == "No widgets in a terminal"
    assert Frontend.JUPYTER.why_no_widgets is None and Frontend.COLAB.shows_widgets
