"""A LangGraph SQL agent: write a query, run it on SQLite, check it, rewrite it on error. No Flywheel code.

The graph (``build_graph``) is a ``StateGraph`` whose model nodes call ``langchain-openai``'s
``ChatOpenAI``::

    START → write_query → execute → check ─(accepted, or MAX_QUERIES written)→ END
                             ↑                 │
                             └──── rewrite ←───┘ (the query failed, or the checker said WRONG)

Three roles, three model names: the writer and the rewriter (``OPENAI_WRITER_MODEL``, default
``writer``; ``OPENAI_REWRITER_MODEL``, default ``rewriter``) and the checker (``OPENAI_CHECKER_MODEL``,
default ``checker``). The endpoint comes from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` only, so a gateway
in front can route each name to a different model and train some roles and not others.
``SQL_AGENT_MAX_TOKENS`` caps each reply (96).

Two ways to run it, one graph:

* callable: ``examples.demo_agents.sql_agent.agent:run`` — ``await run(task, llm)`` builds the three ``ChatOpenAI``
  with ``base_url=llm.base_url, api_key=llm.api_key`` (the role model names as above) and runs the graph
  with ``ainvoke`` on the caller's event loop; the episodes running on one loop share one HTTP pool.
* command: ``python -m examples.demo_agents.sql_agent.agent`` with the task JSON on stdin (or in ``FLYWHEEL_TASK``),
  the endpoint from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.

A task is ``{"task_id": ..., "input": {"question": "...", "db": "/path/db.sqlite"}}``. Both return (the
command prints it as its last stdout line) ``{"output": {"sql": <final query>, "queries": n, "calls": m}}``;
the final query is the answer (scored by execution match).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import httpx
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from examples.demo_agents.sql_agent.prompts import (
    checker_messages,
    execute,
    extract_sql,
    rewriter_messages,
    schema_of,
    verdict,
    writer_messages,
)

MAX_QUERIES = 3


class SQLState(TypedDict, total=False):
    question: str
    db: str
    schema: str
    query: str
    result: str  # a preview of the rows, or "Error: ..."
    failed: bool  # the query did not run
    accepted: bool
    feedback: str  # what the rewriter is told
    queries: int
    calls: int


def _text(reply: Any) -> str:
    content = reply.content
    return content if isinstance(content, str) else json.dumps(content)


def _model(config: RunnableConfig, role: str) -> ChatOpenAI:
    model: ChatOpenAI = config["configurable"][role]
    return model


def build_graph() -> Any:
    """The compiled graph; each run gets its three models in ``config["configurable"]`` (``writer``,
    ``rewriter``, ``checker``), so one graph serves every episode (compiling takes ~20 ms).

    Async nodes, so many episodes share one event loop (the callable form); the command form runs the
    same graph under ``asyncio.run``. SQLite runs in a thread: a runaway query must not block the loop.
    """

    async def write_query(state: SQLState, config: RunnableConfig) -> SQLState:
        messages = writer_messages(state["schema"], state["question"])
        reply = await _model(config, "writer").ainvoke(messages)
        return {"query": extract_sql(_text(reply)), "queries": 1, "calls": state.get("calls", 0) + 1}

    async def run_query(state: SQLState) -> SQLState:
        rows, preview = await asyncio.to_thread(execute, state["db"], state["query"])
        return {"result": preview, "failed": rows is None}

    async def check(state: SQLState, config: RunnableConfig) -> SQLState:
        messages = checker_messages(state["question"], state["query"], state["result"])
        reply = _text(await _model(config, "checker").ainvoke(messages))
        accepted = not state["failed"] and verdict(reply)
        feedback = state["result"] if state["failed"] else reply.strip()[:300]
        return {"accepted": accepted, "feedback": feedback, "calls": state["calls"] + 1}

    async def rewrite(state: SQLState, config: RunnableConfig) -> SQLState:
        messages = rewriter_messages(state["schema"], state["question"], state["query"], state["feedback"])
        reply = await _model(config, "rewriter").ainvoke(messages)
        return {
            "query": extract_sql(_text(reply)),
            "queries": state["queries"] + 1,
            "calls": state["calls"] + 1,
        }

    def route(state: SQLState) -> str:
        return END if state["accepted"] or state["queries"] >= MAX_QUERIES else "rewrite"

    graph = StateGraph(SQLState)
    graph.add_node("write_query", write_query)
    graph.add_node("execute", run_query)
    graph.add_node("check", check)
    graph.add_node("rewrite", rewrite)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute")
    graph.add_edge("execute", "check")
    graph.add_conditional_edges("check", route, ["rewrite", END])
    graph.add_edge("rewrite", "execute")
    return graph.compile()


def chat_models(**client: Any) -> tuple[ChatOpenAI, ChatOpenAI, ChatOpenAI]:
    """The three roles' chat models. ``client`` goes to every ``ChatOpenAI`` (``base_url``, ``api_key``,
    ``http_client``, ...); without them ``ChatOpenAI`` reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""
    max_tokens = int(os.environ.get("SQL_AGENT_MAX_TOKENS", "96"))

    def chat(name: str, default: str, temperature: float) -> ChatOpenAI:
        model = os.environ.get(name, default)
        return ChatOpenAI(
            model=model, temperature=temperature, max_tokens=max_tokens, max_retries=2, **client
        )

    return (
        chat("OPENAI_WRITER_MODEL", "writer", 1.0),
        chat("OPENAI_REWRITER_MODEL", "rewriter", 1.0),
        chat("OPENAI_CHECKER_MODEL", "checker", 0.0),
    )


def models_from_env() -> tuple[ChatOpenAI, ChatOpenAI, ChatOpenAI]:
    """The three roles' chat models; ``ChatOpenAI`` reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""
    return chat_models()


def _state(task: dict[str, Any]) -> SQLState:
    data = task.get("input")
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("question"), str)
        or not isinstance(data.get("db"), str)
    ):
        raise ValueError("task.input must be {'question': str, 'db': path to a SQLite file}")
    return {"question": data["question"], "db": data["db"], "schema": schema_of(data["db"])}


_GRAPH: list[Any] = []


async def _solve(models: tuple[ChatOpenAI, ChatOpenAI, ChatOpenAI], state: SQLState) -> dict[str, Any]:
    if not _GRAPH:
        _GRAPH.append(build_graph())
    writer, rewriter, checker = models
    config: RunnableConfig = {
        "recursion_limit": 4 * MAX_QUERIES + 4,
        "configurable": {"writer": writer, "rewriter": rewriter, "checker": checker},
    }
    final = await _GRAPH[0].ainvoke(state, config)
    return {"output": {"sql": final["query"], "queries": final["queries"], "calls": final["calls"]}}


def solve(task: dict[str, Any]) -> dict[str, Any]:
    """The command form: one episode on a loop of its own, the endpoint from the environment."""
    state = _state(task)
    return asyncio.run(_solve(models_from_env(), state))


class _Pool:
    """One HTTP connection pool per event loop, shared by the episodes running on it and closed when
    the last of them ends: a ``ChatOpenAI`` left to build its own clients loads the system's CA bundle
    for each new ``base_url``, and every episode has its own."""

    def __init__(self) -> None:
        self.client: httpx.AsyncClient | None = None
        self.users = 0


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()
_SYNC: list[httpx.Client] = []  # ChatOpenAI builds its sync client too; the graph never uses it
_TLS: list[ssl.SSLContext] = []  # loading the CA bundle takes ~40 ms of CPU: once per process


def _tls() -> ssl.SSLContext:
    if not _TLS:
        _TLS.append(ssl.create_default_context())
    return _TLS[0]


@contextlib.asynccontextmanager
async def _shared_http() -> AsyncIterator[httpx.AsyncClient]:
    pool = _POOLS.setdefault(asyncio.get_running_loop(), _Pool())
    if pool.client is None:
        pool.client = httpx.AsyncClient(
            timeout=120.0, verify=_tls(), limits=httpx.Limits(max_connections=None)
        )
    client = pool.client
    pool.users += 1
    try:
        yield client
    finally:
        pool.users -= 1
        if pool.users == 0 and pool.client is client:
            pool.client = None
            await client.aclose()


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One episode, in-process. ``llm`` has ``base_url`` and ``api_key`` (the role names pick models)."""
    state = _state(task)
    if not _SYNC:
        _SYNC.append(httpx.Client(timeout=120.0, verify=_tls()))
    async with _shared_http() as http:
        models = chat_models(
            base_url=llm.base_url, api_key=llm.api_key, http_async_client=http, http_client=_SYNC[0]
        )
        return await _solve(models, state)


def main() -> None:
    raw = os.environ.get("FLYWHEEL_TASK") or sys.stdin.read()
    try:
        task = json.loads(raw)
    except json.JSONDecodeError as exc:
        sys.exit(f"sql_agent: the task is not JSON: {exc}")
    try:
        result = solve(task)
    except ValueError as exc:
        sys.exit(f"sql_agent: {exc}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
