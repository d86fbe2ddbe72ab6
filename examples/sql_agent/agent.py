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

Run as a command: ``python -m examples.sql_agent.agent`` with the task JSON on stdin (or in
``FLYWHEEL_TASK``): ``{"task_id": ..., "input": {"question": "...", "db": "/path/db.sqlite"}}``. The last
stdout line is ``{"output": {"sql": <final query>, "queries": n, "calls": m}}``; the final query is the
answer (scored by execution match).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from examples.sql_agent.prompts import (
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


def build_graph(writer: ChatOpenAI, rewriter: ChatOpenAI, checker: ChatOpenAI) -> Any:
    def write_query(state: SQLState) -> SQLState:
        reply = writer.invoke(writer_messages(state["schema"], state["question"]))
        return {"query": extract_sql(_text(reply)), "queries": 1, "calls": state.get("calls", 0) + 1}

    def run_query(state: SQLState) -> SQLState:
        rows, preview = execute(state["db"], state["query"])
        return {"result": preview, "failed": rows is None}

    def check(state: SQLState) -> SQLState:
        reply = _text(checker.invoke(checker_messages(state["question"], state["query"], state["result"])))
        accepted = not state["failed"] and verdict(reply)
        feedback = state["result"] if state["failed"] else reply.strip()[:300]
        return {"accepted": accepted, "feedback": feedback, "calls": state["calls"] + 1}

    def rewrite(state: SQLState) -> SQLState:
        messages = rewriter_messages(state["schema"], state["question"], state["query"], state["feedback"])
        reply = rewriter.invoke(messages)
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


def models_from_env() -> tuple[ChatOpenAI, ChatOpenAI, ChatOpenAI]:
    """The three roles' chat models; ``ChatOpenAI`` reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""
    max_tokens = int(os.environ.get("SQL_AGENT_MAX_TOKENS", "96"))

    def chat(name: str, default: str, temperature: float) -> ChatOpenAI:
        model = os.environ.get(name, default)
        return ChatOpenAI(model=model, temperature=temperature, max_tokens=max_tokens, max_retries=2)

    return (
        chat("OPENAI_WRITER_MODEL", "writer", 1.0),
        chat("OPENAI_REWRITER_MODEL", "rewriter", 1.0),
        chat("OPENAI_CHECKER_MODEL", "checker", 0.0),
    )


def solve(task: dict[str, Any]) -> dict[str, Any]:
    data = task.get("input")
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("question"), str)
        or not isinstance(data.get("db"), str)
    ):
        raise ValueError("task.input must be {'question': str, 'db': path to a SQLite file}")
    graph = build_graph(*models_from_env())
    state: SQLState = {"question": data["question"], "db": data["db"], "schema": schema_of(data["db"])}
    final = graph.invoke(state, {"recursion_limit": 4 * MAX_QUERIES + 4})
    return {"output": {"sql": final["query"], "queries": final["queries"], "calls": final["calls"]}}


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
