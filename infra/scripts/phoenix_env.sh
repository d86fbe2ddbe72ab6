#!/usr/bin/env bash
# Build Arize Phoenix's own environment: the OpenTelemetry receiver the export test reads spans back
# from (tests/e2e/test_otel_phoenix.py). Its own environment because its pins (pandas, sqlalchemy,
# grpcio, the OpenTelemetry packages) are not the main environment's business. Idempotent: with the
# pinned version installed it returns at once.
#
#   bash infra/scripts/phoenix_env.sh      # prints the environment's directory
#
# The environment is FLYWHEEL_PHOENIX_ENV (default ~/.cache/flywheel/venv-phoenix); arize-phoenix
# ${PHOENIX_VERSION:-20.26.1} from PyPI: ~140 packages, ~620 MB on disk, ~10 s with a warm uv cache.
set -euo pipefail
ENV_DIR="${FLYWHEEL_PHOENIX_ENV:-$HOME/.cache/flywheel/venv-phoenix}"
VERSION="${PHOENIX_VERSION:-20.26.1}"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q uv || python3 -m pip install -q --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi
if [ -x "$ENV_DIR/bin/phoenix" ] &&
    [ "$("$ENV_DIR/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))' 2>/dev/null)" = "$VERSION" ]; then
    echo "$ENV_DIR"
    exit 0
fi
[ -x "$ENV_DIR/bin/python" ] || uv venv -q "$ENV_DIR" --python 3.11
uv pip install -q --python "$ENV_DIR/bin/python" "arize-phoenix==$VERSION"
echo "$ENV_DIR"
