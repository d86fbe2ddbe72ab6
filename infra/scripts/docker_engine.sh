#!/usr/bin/env bash
# A Docker engine for the compose end-to-end test (tests/compose), started here when none answers.
#
#   DOCKER_HOST="$(bash infra/scripts/docker_engine.sh start)"   # prints the socket's URL
#   bash infra/scripts/docker_engine.sh stop                      # stops only a daemon `start` started
#   bash infra/scripts/docker_engine.sh status                    # exit 0 when an engine answers
#
# `start`: installs Debian's docker.io, docker-compose and debootstrap where missing (apt-get; root or
# sudo), then uses the engine at $DOCKER_HOST or /var/run/docker.sock if one answers; otherwise starts
# `dockerd` with its own data root (FLYWHEEL_DOCKER_ROOT, default ~/.cache/flywheel/docker: outside the
# checkout, so image layers and the build cache survive between runs), socket and pid file, and waits
# until it answers. `stop` ends that daemon (SIGTERM, then SIGKILL after 30 s) and nothing else.
set -euo pipefail

ROOT="${FLYWHEEL_DOCKER_ROOT:-$HOME/.cache/flywheel/docker}"
RUN_DIR="${FLYWHEEL_DOCKER_RUN:-/run/flywheel-docker}"  # short: the exec root holds unix sockets
SOCK="$RUN_DIR/docker.sock"
PID_FILE="$RUN_DIR/dockerd.pid"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

answers() {  # the engine at $1 answers a version request
    DOCKER_HOST="$1" /usr/bin/docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_missing() {
    local missing=()
    [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || missing+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
    if [ "${#missing[@]}" -ne 0 ]; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

start() {
    install_missing
    for host in "${DOCKER_HOST:-}" unix:///var/run/docker.sock "unix://$SOCK"; do
        if [ -n "$host" ] && answers "$host"; then
            echo "$host"
            return 0
        fi
    done
    $SUDO mkdir -p "$ROOT/data" "$RUN_DIR/exec"
    # cgroupfs: no systemd here; overlay2 where the kernel offers it (dockerd falls back on its own)
    $SUDO dockerd --data-root "$ROOT/data" --exec-root "$RUN_DIR/exec" --pidfile "$PID_FILE" \
        -H "unix://$SOCK" --exec-opt native.cgroupdriver=cgroupfs \
        >"$ROOT/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        if answers "unix://$SOCK"; then
            echo "unix://$SOCK"
            return 0
        fi
        sleep 0.5
    done
    echo "docker_engine.sh: dockerd did not answer within 60 s; its log:" >&2
    tail -n 20 "$ROOT/dockerd.log" >&2 || true
    return 1
}

stop() {
    [ -f "$PID_FILE" ] || return 0
    local pid
    pid="$(cat "$PID_FILE")"
    $SUDO kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 60); do
        $SUDO kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    $SUDO kill -9 "$pid" 2>/dev/null || true
}

status() {
    for host in "${DOCKER_HOST:-}" unix:///var/run/docker.sock "unix://$SOCK"; do
        [ -n "$host" ] && [ -x /usr/bin/docker ] && answers "$host" && return 0
    done
    return 1
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
