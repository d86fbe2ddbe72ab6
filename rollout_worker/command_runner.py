"""Command agents: ``python my_agent.py …`` as a subprocess in its own process group.

The task arrives as JSON on stdin and in ``FLYWHEEL_TASK``; the OpenAI variables point at the episode.
The last stdout line that is a JSON object is the agent's result (``{"reward": …, "output": …}``).
Only the tails of stdout and stderr are kept, so an agent printing garbage cannot exhaust memory.
At the deadline the whole process group gets SIGTERM, then SIGKILL after a grace period; after any
exit the group is killed too, so grandchildren never outlive their episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections import deque

from rollout_worker.runners import AgentResult, AgentRun, AgentSpecError, Stopwatch, parse_final_line
from schemas import EpisodeStatus

_CHUNK = 64 * 1024


class _Tail:
    """The last ``limit`` characters of a stream, read to EOF."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_CHUNK):
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size - len(self.chunks[0]) >= self.limit and len(self.chunks) > 1:
                self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks)[-self.limit :].decode("utf-8", errors="replace")


def command_argv(spec: str) -> list[str]:
    """Split a command line; a leading ``python``/``python3`` runs under the worker's interpreter."""
    try:
        argv = shlex.split(spec)
    except ValueError as exc:
        raise AgentSpecError(spec, str(exc)) from exc
    if not argv:
        raise AgentSpecError(spec, "empty command")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class CommandRunner:
    def __init__(self, *, kill_grace_s: float = 2.0, tail_chars: int = 4000, cwd: str | None = None) -> None:
        self.kill_grace_s = kill_grace_s
        self.tail_chars = tail_chars
        self.cwd = cwd

    async def run(self, run: AgentRun) -> AgentResult:
        argv = command_argv(run.agent.spec)
        stdin = (run.env()["FLYWHEEL_TASK"] + "\n").encode()
        watch = Stopwatch()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **run.env()},
                cwd=self.cwd,
                start_new_session=True,  # its own process group: we kill the group, not just the child
            )
        except OSError as exc:
            raise AgentSpecError(run.agent.spec, f"{type(exc).__name__}: {exc}") from exc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out, err = _Tail(self.tail_chars), _Tail(self.tail_chars)
        readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr), _feed(proc.stdin, stdin))
        status = EpisodeStatus.ok
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(run.deadline_s, 0.001))
        except TimeoutError:
            status = EpisodeStatus.timeout
            await self._terminate(proc)
        except asyncio.CancelledError:
            await self._terminate(proc)
            readers.cancel()
            raise
        finally:
            kill_group(proc.pid, signal.SIGKILL)
        agent_s = watch.elapsed()
        try:
            await asyncio.wait_for(readers, timeout=1.0)  # pipes close once the group is gone
        except (TimeoutError, OSError):
            readers.cancel()
        output, reward, _found = parse_final_line(out.text())
        error: str | None = None
        if status is EpisodeStatus.timeout:
            error = f"deadline of {run.deadline_s:g}s passed; process group killed\n" + err.text()
        elif proc.returncode != 0:
            status = EpisodeStatus.error
            error = f"exit code {proc.returncode}\n" + err.text()
        return AgentResult(status=status, output=output, reward=reward, error=error, agent_s=agent_s)

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=self.kill_grace_s)
        except TimeoutError:
            kill_group(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def aclose(self) -> None:
        return None


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    # An agent that never reads stdin (or exits at once) must not fail the episode.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()
