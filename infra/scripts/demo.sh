#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job: `flywheel demo` on the embedded stack.
# The setup is install.sh's (uv sync into ~/.cache/flywheel/venv, `flywheel` linked into ~/.local/bin),
# so the bare `flywheel` of the docs works afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
export UV_PROJECT_ENVIRONMENT="${UV_PROJECT_ENVIRONMENT:-$HOME/.cache/flywheel/venv}"
bash infra/scripts/install.sh
exec "$UV_PROJECT_ENVIRONMENT/bin/flywheel" demo "$@"
