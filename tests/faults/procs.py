"""Real processes for the fault suite: ``flywheel up`` on a free loopback port, and figures to quote."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "faults-admin-token-0123456789abcdef"
FIGURES = Path(os.environ.get("FLYWHEEL_FAULT_FIGURES", "/tmp/flywheel-fault-figures.jsonl"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anyone's ``FLYWHEEL_*`` (the shared broker included), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_TRAINER_TORCH_THREADS": "1", **extra})
    return env


@dataclass
class Figures:
    """What a fault test measured, printed and appended to ``FIGURES`` (one JSON object a line)."""

    test: str
    calls: int = 0
    ok: int = 0
    lost: int = 0
    duplicates: int = 0
    server_errors: int = 0
    recover_s: float | None = None
    extra: dict[str, float | int | str] = field(default_factory=dict)

    def report(self) -> None:
        line = json.dumps(asdict(self), sort_keys=True)
        print(f"FAULT-FIGURES {line}")
        with contextlib.suppress(OSError), FIGURES.open("a") as out:
            out.write(line + "\n")


class Up:
    """``flywheel up --tiny --no-trainer`` as a child process on a free port."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [FLYWHEEL, "up", "--tiny", "--no-trainer", "--port", str(self.port), "--data-dir", str(data_dir)],
            env=clean_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, timeout_s: float = 150.0) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"flywheel up exited with {self.proc.returncode}: {self.output()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(0.2)
        raise AssertionError(f"flywheel up was not ready within {timeout_s} s: {self.output()}")

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-3000:]

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def flywheel_up(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path / "data", tmp_path / "up.log")
    try:
        up.wait_ready()
        yield up
    finally:
        up.kill()


class ThreadServer:
    """An ASGI app served by uvicorn on a free loopback port from its own thread (a test's upstream)."""

    def __init__(self, app: object) -> None:
        import asyncio
        import threading

        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError("the test upstream did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


class ChildProcess:
    """A ``flywheel`` child process that can be SIGKILLed, or stopped (SIGTERM, then SIGKILL after 20 s)."""

    proc: subprocess.Popen[Any] | None = None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class GatewayProcess(ChildProcess):
    """``flywheel gateway`` on Kafka as a child process, on a fixed port and data directory."""

    def __init__(self, upstream: str, data_dir: Path, env: dict[str, str], log_path: Path) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.env = {**env, "FLYWHEEL_DATA_DIR": str(data_dir)}
        self.log_path = log_path

    def start(self) -> None:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [
                FLYWHEEL,
                "gateway",
                "--upstream",
                f"{self.upstream}/v1",
                "--kind",
                "vllm",
                "--port",
                str(self.port),
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log.close()

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        started = time.monotonic()
        with httpx.Client(timeout=2) as client:
            while time.monotonic() - started < timeout_s:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"flywheel gateway exited: {self.log_path.read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return time.monotonic() - started
                time.sleep(0.05)  # polling another process's port: no event to wait on
        raise AssertionError(f"flywheel gateway not ready: {self.log_path.read_text()[-2000:]}")
