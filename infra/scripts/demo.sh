#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job: `flywheel demo` on the embedded stack.
set -euo pipefail
cd "$(dirname "$0")/../.."
export UV_PROJECT_ENVIRONMENT="${UV_PROJECT_ENVIRONMENT:-$HOME/.cache/flywheel/venv}"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q uv || python3 -m pip install -q --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi
uv sync --frozen -q --extra train --extra examples --extra k8s --extra dev  # every extra but `verl` (it conflicts with `train`)
exec "$UV_PROJECT_ENVIRONMENT/bin/flywheel" demo "$@"
