"""Command agents: ``python my_agent.py …`` as a subprocess in its own process group.

The task arrives as JSON on stdin and in ``FLYWHEEL_TASK``; the OpenAI variables point at the episode.
The last stdout line that is a JSON object is the agent's result (``{"reward": …, "output": …}``).
Only the tails of stdout and stderr are kept, so an agent printing garbage cannot exhaust memory.
At the deadline the whole process group gets SIGTERM, then SIGKILL after a grace period; after any
exit the group is killed too, so grandchildren never outlive their episode.

Why not ``asyncio.create_subprocess_exec``: it forks on the event loop's thread and, on Python < 3.12,
starts one waiter thread per child (``ThreadedChildWatcher``), and ``Thread.start()`` blocks until that
thread first runs. With many agents starting at once on a busy machine, every spawn stalled the loop
(and every other episode's events) for milliseconds. Here the fork/exec runs on a small thread pool,
the exit is awaited on a pidfd (Linux ≥ 5.3; elsewhere a poll), and the pipes are plain asyncio pipe
transports: the loop never blocks on a spawn and no thread is started per agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal
import subprocess
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import IO

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


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` to exit and reap it, without blocking the loop or starting a thread."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux ≥ 5.3 (or already reaped): poll
        delay = 0.001
        while (code := proc.poll()) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await exited  # a pidfd turns readable when the process has exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()  # it has exited: this reaps it at once


class _Pipes:
    """The child's stdio as asyncio pipe transports: stdin fed once, stdout/stderr tails read to EOF."""

    def __init__(self, tail_chars: int) -> None:
        self.out, self.err = _Tail(tail_chars), _Tail(tail_chars)
        self.transports: list[asyncio.BaseTransport] = []

    async def _reader(self, pipe: IO[bytes]) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        self.transports.append(transport)
        return reader

    async def run(self, proc: subprocess.Popen[bytes], data: bytes) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        loop = asyncio.get_running_loop()
        # An agent that never reads stdin (or exits at once) must not fail the episode: a write to a
        # closed pipe only closes the transport (EPIPE; SIGPIPE is ignored in Python processes).
        stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
        self.transports.append(stdin)
        stdin.write(data)
        stdin.close()  # after the buffer is flushed
        out, err = await self._reader(proc.stdout), await self._reader(proc.stderr)
        await asyncio.gather(self.out.drain(out), self.err.drain(err))

    def close(self) -> None:
        for transport in self.transports:
            if transport.is_closing():
                continue
            if isinstance(transport, asyncio.WriteTransport):
                transport.abort()  # drop what the (dead) agent never read
            else:
                transport.close()


class CommandRunner:
    def __init__(
        self,
        *,
        kill_grace_s: float = 2.0,
        tail_chars: int = 4000,
        cwd: str | None = None,
        spawn_threads: int = 2,
        nice: int = 0,
    ) -> None:
        self.kill_grace_s = kill_grace_s
        self.nice = nice
        self.tail_chars = tail_chars
        self.cwd = cwd
        self._spawner = ThreadPoolExecutor(max_workers=spawn_threads, thread_name_prefix="agent-spawn")

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: we kill the group, not just the child
        )
        if self.nice:
            # Lower the agent's CPU priority (children it forks later inherit it); an agent that is
            # already gone only loses the race. See ``WorkerSettings.agent_nice`` for why.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
        return proc

    async def _spawn(self, spec: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        spawn = functools.partial(self._popen, argv, env)
        future = asyncio.get_running_loop().run_in_executor(self._spawner, spawn)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # A fork/exec cannot be interrupted: let it finish, then kill and reap what it started.
            with contextlib.suppress(Exception):
                proc = await future
                kill_group(proc.pid, signal.SIGKILL)
                await wait_exit(proc)
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
            raise
        except OSError as exc:
            raise AgentSpecError(spec, f"{type(exc).__name__}: {exc}") from exc

    async def run(self, run: AgentRun) -> AgentResult:
        argv = command_argv(run.agent.spec)
        agent_env = run.env()
        data = (agent_env["FLYWHEEL_TASK"] + "\n").encode()
        env = os.environ | agent_env
        watch = Stopwatch()
        proc = await self._spawn(run.agent.spec, argv, env)
        pipes = _Pipes(self.tail_chars)
        readers = asyncio.ensure_future(pipes.run(proc, data))
        status = EpisodeStatus.ok
        try:
            try:
                await asyncio.wait_for(wait_exit(proc), timeout=max(run.deadline_s, 0.001))
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
        finally:
            pipes.close()
        output, reward, _found = parse_final_line(pipes.out.text())
        error: str | None = None
        if status is EpisodeStatus.timeout:
            error = f"deadline of {run.deadline_s:g}s passed; process group killed\n" + pipes.err.text()
        elif proc.returncode != 0:
            status = EpisodeStatus.error
            error = f"exit code {proc.returncode}\n" + pipes.err.text()
        return AgentResult(status=status, output=output, reward=reward, error=error, agent_s=agent_s)

    async def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(wait_exit(proc), timeout=self.kill_grace_s)
        except TimeoutError:
            kill_group(proc.pid, signal.SIGKILL)
            await wait_exit(proc)

    async def aclose(self) -> None:
        self._spawner.shutdown(wait=False)
