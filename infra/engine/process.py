"""The embedded engine in a child process: ``flywheel engine`` on a loopback port, owned by the stack.

Why a process: the engine's decode loop is hundreds of small torch calls per step, and each one
re-acquires the GIL. In the stack's process the event loop (agents, gateway, bus, reward service) holds
the GIL most of the time, so every decode step waited on it (measured: 8 ms alone, 33 ms beside a busy
loop; docs/results/tuning.md). In its own process the engine has its own interpreter, which is also how
a real deployment runs vLLM next to the gateway.

The gateway reaches it over loopback HTTP, the trainer loads weights through ``POST /load_weights``
with a checkpoint path (``trainer.weights.HttpSink``): the same protocol as for a server on another host.

    proc = await EngineProcess.start(model_dir, log_path=..., model_name="policy")
    proc.url            # http://127.0.0.1:PORT (OpenAI routes under /v1)
    proc.admin_token    # bearer token for /pause, /resume, /load_weights
    await proc.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

PARENT_ENV = "FLYWHEEL_ENGINE_PARENT_PID"


class EngineProcessError(RuntimeError):
    pass


def exit_with_parent(poll_s: float = 0.5) -> None:
    """In the child: stop (SIGTERM to itself, so the server shuts down cleanly) once the process that
    started it is gone. ``EngineProcess.stop`` covers an orderly exit; this covers a parent that was
    killed (a killed demo left its engine serving: docs/results/tuning.md). Does nothing
    unless the launcher set ``FLYWHEEL_ENGINE_PARENT_PID``."""
    raw = os.environ.get(PARENT_ENV)
    if not raw or not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class EngineProcess:
    def __init__(self, proc: asyncio.subprocess.Process, url: str, admin_token: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.admin_token = admin_token
        self.log_path = log_path

    @classmethod
    async def start(
        cls,
        model_dir: Path,
        *,
        log_path: Path,
        model_name: str,
        max_num_seqs: int,
        threads: int | None = None,
        ready_timeout_s: float = 180.0,
    ) -> EngineProcess:
        """Start ``flywheel engine`` and wait until ``/health`` answers (or the child exits)."""
        port = _free_port()
        token = secrets.token_urlsafe(24)
        cmd = [
            sys.executable,
            "-m",
            "flywheel.cli.main",
            "engine",
            "--model",
            str(model_dir),
            "--port",
            str(port),
            "--served-model-name",
            model_name,
            "--max-num-seqs",
            str(max_num_seqs),
        ]
        if threads:
            cmd += ["--threads", str(threads)]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FLYWHEEL_ENGINE_ADMIN_TOKEN": token, PARENT_ENV: str(os.getpid())}
        with log_path.open("ab") as log:
            # a session of its own: a terminal's Ctrl-C (SIGINT to the whole foreground group) is the
            # stack's to handle; the stack stops the engine after the parts that still call it, and a
            # parent that died stops it through ``exit_with_parent``
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self = cls(proc, f"http://127.0.0.1:{port}", token, log_path)
        try:
            await self._wait_ready(ready_timeout_s)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                code = self.proc.returncode
                if code is not None:
                    raise EngineProcessError(
                        f"the engine process exited with code {code} before it was ready; "
                        f"its log ({self.log_path}) ends with:\n{_tail(self.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise EngineProcessError(
                        f"the engine process did not answer /health within {timeout_s:.0f}s "
                        f"(log: {self.log_path})"
                    )
                await asyncio.sleep(0.2)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (uvicorn shuts down cleanly), SIGKILL after ``timeout_s``; reaps the child."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
