#!/usr/bin/env bash
# Installs the command-line tools the ops tests validate with, if they are missing:
#   docker-compose  (Debian's package; `docker-compose config` validates infra/docker-compose.yml
#                    without a Docker engine)
#   kubeconform     (from the Go module proxy into ~/.cache/flywheel/bin; validates infra/k8s offline
#                    against the JSON schemas shipped in the kubernetes-validate PyPI package)
# Idempotent and quiet; safe to run before every test run.
set -euo pipefail

BIN_DIR="${FLYWHEEL_TOOLS_BIN:-$HOME/.cache/flywheel/bin}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.8.0}"
mkdir -p "$BIN_DIR"

if ! command -v docker-compose >/dev/null 2>&1; then
    echo "ensure_tools: installing docker-compose (apt)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi

if [ ! -x "$BIN_DIR/kubeconform" ] && ! command -v kubeconform >/dev/null 2>&1; then
    GO="$(command -v go || true)"
    [ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
    if [ -z "$GO" ]; then
        echo "ensure_tools: no Go toolchain; cannot install kubeconform" >&2
        exit 1
    fi
    echo "ensure_tools: installing kubeconform $KUBECONFORM_VERSION (go install)" >&2
    GOBIN="$BIN_DIR" "$GO" install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
fi
