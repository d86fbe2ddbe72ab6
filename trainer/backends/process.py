"""The torch backend in a process of its own, so that training never waits for the service's GIL.

Why: the service's event loop (bus, intake, inbox, rollout requests, the weight protocol, and in the
embedded stack the gateway, recorder and reward service too) runs in the trainer's process. A training
step is thousands of small torch ops, and each one releases the GIL and must take it back; whenever the
loop holds it, the step waits (measured: a 205 ms step took 374 ms beside a loop busy half the time;
docs/results/tuning.md). A second process has its own GIL.

How: :class:`ProcessBackend` starts ``python -m trainer.backends.process`` (a fresh interpreter: no
``multiprocessing`` re-import of the caller's ``__main__``), which builds a :class:`TorchBackend` from
the model directory and answers calls over a socket pair, one at a time: ``train_step``, ``sft_step``,
``export_weights``, ``save_checkpoint``, ``load_checkpoint`` and ``state_dict`` (sent as safetensors
bytes). Batches and metrics are plain data. An exception in the child, a child that died, or a call that
outlives ``call_timeout_s`` raises :class:`BackendError`, which the service treats as a failed step.

Signals: the child runs in a session of its own, so a terminal's Ctrl-C (SIGINT to every process of the
foreground group) or a ``kill`` of the trainer's group reaches the trainer alone, which finishes its step,
has the child write the final checkpoint and only then closes it; in the trainer's group, the child died of
the KeyboardInterrupt first and the last checkpoint was lost. The parent's death is the child's only
signal: it exits when the pipe closes, or, in the middle of a call, as soon as its parent is gone
(:func:`exit_with_parent`), so it never outlives a killed trainer nor a second Ctrl-C
(``tests/e2e/test_up_sigint.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from safetensors.torch import load, save

from trainer.backends.base import BackendError
from trainer.backends.torch_backend import load_backend
from trainer.batching import Sample, TrainBatch
from trainer.config import AlgorithmConfig, ModelOptions

_CALLS = frozenset({"train_step", "sft_step", "export_weights", "save_checkpoint", "load_checkpoint"})


def exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """In a child: exit at once when ``parent`` (the process that started it) is gone, even in the middle
    of a call, whose answer no one would read (a checkpoint is renamed into place by the parent, so one
    cut short is never taken for a complete one)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _serve(
    conn: Connection, model_dir: str, algo: dict[str, Any], device: str, threads: int, options: str
) -> None:
    """The child: build the backend, then answer ``(method, args)`` until the pipe closes or ``None``."""
    serve_backend(
        conn,
        lambda: load_backend(
            Path(model_dir),
            AlgorithmConfig.model_validate(algo),
            device=device,
            torch_threads=threads,
            model_options=ModelOptions.model_validate_json(options),
        ),
    )


def serve_backend(conn: Connection, build: Callable[[], Any], calls: frozenset[str] = _CALLS) -> None:
    """Build a backend with ``build``, then answer ``(method, args)`` until the pipe closes or ``None``.

    Also the child of :class:`trainer.backends.ddp.DataParallelProcessBackend` (rank 0 of a group).
    """
    try:
        backend = build()
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}", 0))
        return
    conn.send(("ready", backend.vocab_size, backend.version))
    try:
        _answer(conn, backend, calls)
    finally:
        backend.close()  # a data-parallel rank 0 stops its group here


def _answer(conn: Connection, backend: Any, calls: frozenset[str]) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg is None:
            return
        method, args = msg
        try:
            if method == "state_dict":
                result: Any = save({k: v.contiguous() for k, v in backend.state_dict().items()})
            elif method in calls:
                result = getattr(backend, method)(*args)
            else:
                raise BackendError(f"unknown call {method!r}")
            reply: tuple[str, Any, int] = ("ok", result, backend.version)
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}", backend.version)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


class ProcessBackend:
    """A :class:`~trainer.backends.base.Backend` whose :class:`TorchBackend` lives in a child process."""

    def __init__(
        self,
        model_dir: Path,
        algo: AlgorithmConfig,
        *,
        device: str = "cpu",
        torch_threads: int = 0,
        model_options: ModelOptions | None = None,
        start_timeout_s: float = 120.0,
        call_timeout_s: float = 600.0,
    ) -> None:
        self.cfg = algo
        self.call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        argv = self._child_argv(theirs.fileno(), model_dir, algo, device, torch_threads)
        argv += ["--model-options", (model_options or ModelOptions()).model_dump_json()]
        with ours, theirs:
            # a session of its own: the group's Ctrl-C is the trainer's to handle (see the module docstring)
            self._proc = subprocess.Popen(
                argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, start_new_session=True
            )
            self._conn = Connection(os.dup(ours.fileno()))
        self._version = 0
        self._vocab_size: int | None = None
        try:
            status, first, version = self._receive(start_timeout_s, "start")
        except BackendError:
            self.close(timeout_s=1.0)  # a child that is slow to start or already gone is not left behind
            raise
        if status != "ready":
            self.close()
            raise BackendError(f"the training process did not start: {first}")
        self._vocab_size, self._version = first, version

    def _child_argv(
        self, fd: int, model_dir: Path, algo: AlgorithmConfig, device: str, torch_threads: int
    ) -> list[str]:
        """The child's command line (a subclass runs another module, e.g. rank 0 of a data-parallel group)."""
        return [
            *(sys.executable, "-m", "trainer.backends.process", "--fd", str(fd)),
            *("--model-dir", str(model_dir), "--algo", algo.model_dump_json()),
            *("--device", device, "--threads", str(torch_threads)),
        ]

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _receive(self, timeout_s: float, what: str) -> tuple[str, Any, int]:
        try:
            if not self._conn.poll(timeout_s):
                raise BackendError(f"the training process did not answer {what} within {timeout_s:.0f} s")
            reply: tuple[str, Any, int] = self._conn.recv()
        except (EOFError, OSError) as exc:
            code = self._proc.poll()
            raise BackendError(f"the training process exited (code {code}) during {what}") from exc
        return reply

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if self._proc.poll() is not None:
                raise BackendError(f"the training process is not running (exit code {self._proc.returncode})")
            try:
                self._conn.send((method, args))
            except (BrokenPipeError, OSError) as exc:
                raise BackendError(f"the training process is gone: {exc}") from exc
            status, result, version = self._receive(self.call_timeout_s, method)
        self._version = version
        if status != "ok":
            raise BackendError(str(result))
        return result

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        metrics: dict[str, float] = self._call("train_step", batch)
        return metrics

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        metrics: dict[str, float] = self._call("sft_step", list(samples))
        return metrics

    def state_dict(self) -> Mapping[str, Any]:
        tensors: Mapping[str, Any] = load(self._call("state_dict"))
        return tensors

    def export_weights(self, directory: Path) -> Path:
        path: Path = self._call("export_weights", directory)
        return path

    def save_checkpoint(self, directory: Path) -> None:
        self._call("save_checkpoint", directory)

    def load_checkpoint(self, directory: Path, version: int) -> None:
        self._call("load_checkpoint", directory, version)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (after the call in progress, if any) and close the pipe."""
        with self._lock:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(None)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout_s)
            self._conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="the training process of a ProcessBackend (internal)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--algo", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--model-options", default="{}")
    args = parser.parse_args()
    exit_with_parent(os.getppid())
    algo = json.loads(args.algo)
    _serve(Connection(args.fd), args.model_dir, algo, args.device, args.threads, args.model_options)


if __name__ == "__main__":
    main()
