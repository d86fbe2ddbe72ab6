"""Callable agents: ``package.module:function(task, llm)``, sync or async, many at once in one worker.

Async functions run on the worker's loop and are cancelled at their deadline. Sync functions run on a
thread pool sized to the worker's concurrency; Python cannot kill a thread, so a sync agent that
overruns its deadline is reported as ``timeout`` at once and its thread is left to finish on its own
(its later calls reach a closed episode and get 404). Use a command agent for untrusted code.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import JsonValue, TypeAdapter, ValidationError

from rollout_worker.runners import AgentResult, AgentRun, AgentSpecError, Stopwatch, split_result
from schemas import EpisodeStatus

_JSON = TypeAdapter[JsonValue](JsonValue)


def load_callable(spec: str) -> Callable[..., Any]:
    """``package.module:function`` (``module:Class.method`` works too) → the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AgentSpecError(spec, "expected 'package.module:function'")
    if os.getcwd() not in sys.path:  # like ``python -m``: the user's modules resolve from where they run
        sys.path.append(os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything while importing
        raise AgentSpecError(spec, f"import failed: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise AgentSpecError(spec, f"{module_name} has no attribute {attr!r}") from exc
    if not callable(target):
        raise AgentSpecError(spec, f"{attr!r} is not callable")
    return target  # type: ignore[no-any-return]


class CallableRunner:
    def __init__(self, *, threads: int = 16) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agent")
        self._cache: dict[str, Callable[..., Any]] = {}

    def _resolve(self, spec: str) -> Callable[..., Any]:
        fn = self._cache.get(spec)
        if fn is None:
            fn = self._cache[spec] = load_callable(spec)
        return fn

    async def run(self, run: AgentRun) -> AgentResult:
        fn = self._resolve(run.agent.spec)
        watch = Stopwatch()
        if inspect.iscoroutinefunction(fn):
            work: asyncio.Future[Any] = asyncio.ensure_future(fn(run.task, run.llm))
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self._pool, functools.partial(fn, run.task, run.llm))
        try:
            value = await asyncio.wait_for(work, timeout=max(run.deadline_s, 0.001))
        except TimeoutError:
            return AgentResult(
                status=EpisodeStatus.timeout,
                error=f"deadline of {run.deadline_s:g}s passed",
                agent_s=watch.elapsed(),
            )
        except Exception as exc:  # the agent's own failure: report it, keep the worker alive
            tail = "".join(traceback.format_exception(exc)[-12:])
            return AgentResult(status=EpisodeStatus.error, error=tail, agent_s=watch.elapsed())
        agent_s = watch.elapsed()
        if inspect.isawaitable(value):  # a sync function that returned a coroutine
            value = await value
        try:
            json_value = _JSON.validate_python(value)
        except ValidationError:
            json_value = repr(value)[:4000]
        output, reward = split_result(json_value)
        return AgentResult(status=EpisodeStatus.ok, output=output, reward=reward, agent_s=agent_s)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
