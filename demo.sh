#!/usr/bin/env bash
# Open the allocconf_widget demo: JupyterLab on notebooks/quickstart.ipynb.
#
# Works on a machine without a GPU (the monitor, report and what-if parts replay a
# bundled real H200 recording). Creates .venv on first use; later runs start at once.
#   ./demo.sh                 # opens a browser; else open the printed
#                             # http://127.0.0.1:8888/lab/tree/demo-notebooks/quickstart.ipynb?token=... URL
#   ./demo.sh --port 9999     # extra arguments go to `jupyter lab`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating $VENV ..."
    "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "Installing torch 2.13.0 (first run only) ..."
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
fi
if ! "$VENV/bin/python" -c "import allocconf_widget, jupyterlab, anywidget" 2>/dev/null; then
    echo "Installing allocconf_widget and JupyterLab (first run only) ..."
    "$VENV/bin/python" -m pip install -q -e '.[demo]'
fi
# The demo runs copies in demo-notebooks/ (git-ignored): Run All autosaves outputs, and JupyterLab
# marks a notebook modified as soon as its kernel reports its Python version, so the tracked
# notebooks/*.ipynb would change under git. A copy is made once; delete it for a fresh one.
RUN_DIR=demo-notebooks
mkdir -p "$RUN_DIR"
for nb in notebooks/*.ipynb; do
    [ -e "$RUN_DIR/$(basename "$nb")" ] || cp "$nb" "$RUN_DIR/"
done
# The venv's bin first on the PATH of the server, so its terminals (File > New > Terminal) run
# `allocconf`, `python` and `pip` of this venv, as the README's command lines expect. The
# terminals get this shell as it is: started without a terminal of its own (a log file, nohup),
# Jupyter runs a login shell, whose /etc/profile sets PATH afresh and drops the venv again.
VENV_DIR=$(cd "$VENV" && pwd)
export VIRTUAL_ENV="$VENV_DIR"
export PATH="$VENV_DIR/bin:$PATH"
TERMINAL_SHELL=${SHELL:-$(command -v bash || command -v sh)}
# default_url: the URL JupyterLab prints opens the demo notebook, not the Launcher
args=(--ip=127.0.0.1 --ServerApp.root_dir="$PWD" --LabApp.default_url=/lab/tree/$RUN_DIR/quickstart.ipynb
      "--ServerApp.terminado_settings={\"shell_command\": [\"$TERMINAL_SHELL\"]}")
[ "$(id -u)" = 0 ] && args+=(--allow-root)
echo "Starting JupyterLab on $RUN_DIR/quickstart.ipynb, a copy of notebooks/quickstart.ipynb (Ctrl-C twice to stop) ..."
exec "$VENV/bin/jupyter" lab "${args[@]}" "$RUN_DIR/quickstart.ipynb" "$@"
