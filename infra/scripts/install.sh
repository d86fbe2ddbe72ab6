#!/usr/bin/env bash
# Installs Flywheel from this checkout and puts `flywheel` on PATH:
#
#   bash infra/scripts/install.sh            # uv sync into ~/.cache/flywheel/venv, then the link
#   bash infra/scripts/install.sh --no-sync  # only the link, to an environment already installed
#
# The environment is UV_PROJECT_ENVIRONMENT (default ~/.cache/flywheel/venv), with every extra but `verl`
# (it conflicts with `train`); uv is pip-installed first where missing. `flywheel` is then a symbolic
# link in ~/.local/bin to the environment's console script (the folder created if missing; a file
# there that is not a link is left alone, with a warning). When ~/.local/bin is not on the caller's PATH
# it prints the line to add. demo.sh runs this before `flywheel demo`;
# tests/unit/test_install_script.py runs it with a temporary HOME.
set -euo pipefail
cd "$(dirname "$0")/../.."
export UV_PROJECT_ENVIRONMENT="${UV_PROJECT_ENVIRONMENT:-$HOME/.cache/flywheel/venv}"
BIN_DIR="$HOME/.local/bin"
CALLER_PATH="$PATH"  # before uv's own install below puts BIN_DIR on it

sync=1
for arg in "$@"; do
    case "$arg" in
        --no-sync) sync=0 ;;
        *) echo "usage: install.sh [--no-sync]" >&2; exit 2 ;;
    esac
done

if [ "$sync" = 1 ]; then
    if ! command -v uv >/dev/null 2>&1; then
        python3 -m pip install -q uv || python3 -m pip install -q --user uv
        export PATH="$HOME/.local/bin:$PATH"
    fi
    uv sync --frozen -q --extra train --extra examples --extra k8s --extra dev
fi

if [ ! -x "$UV_PROJECT_ENVIRONMENT/bin/flywheel" ]; then
    echo "install.sh: no $UV_PROJECT_ENVIRONMENT/bin/flywheel (run without --no-sync to install it)" >&2
    exit 1
fi
target="$(cd "$UV_PROJECT_ENVIRONMENT/bin" && pwd)/flywheel"  # absolute: the link works from anywhere
link="$BIN_DIR/flywheel"
if [ -e "$link" ] && [ ! -L "$link" ]; then
    echo "install.sh: $link is not a link: left alone (remove it and run again, or run $target)" >&2
    exit 0
fi
mkdir -p "$BIN_DIR"
ln -sfn "$target" "$link"
echo "flywheel: $link -> $target" >&2
case ":$CALLER_PATH:" in
    *":$BIN_DIR:"*) ;;
    *)
        echo "$BIN_DIR is not on PATH; add it (e.g. in ~/.bashrc or ~/.profile):" >&2
        echo "    export PATH=\"\$HOME/.local/bin:\$PATH\"" >&2
        ;;
esac
