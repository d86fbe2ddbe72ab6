"""A LangGraph agent that must use its tool first: ``ChatOpenAI`` bound to ``multiply`` with a named
``tool_choice``, a ``ToolNode``, then the same model (tools still bound, choice left to it) answers.

A plain LangGraph program (nothing of Flywheel): ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` from the
environment, the task as JSON on stdin, ``{"output": ...}`` as the last stdout line. Forcing the first
call is what a small model needs to call a tool at all.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

TOOL_CALLS: list[dict[str, int]] = []
# one example of the call in the chat template's own format: a 135 M model copies it faithfully
SYSTEM = 'To multiply, call the tool like this: <tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


def build_graph() -> Any:
    llm = ChatOpenAI(
        model=os.environ.get("OPENAI_MODEL", "policy"), max_retries=1, temperature=0, max_tokens=48
    )
    first = llm.bind_tools([multiply], tool_choice="multiply")
    answer = llm.bind_tools([multiply], tool_choice="none")

    graph = StateGraph(MessagesState)
    graph.add_node("call_tool", lambda s: {"messages": [first.invoke(s["messages"])]})
    graph.add_node("tools", ToolNode([multiply]))
    graph.add_node("answer", lambda s: {"messages": [answer.invoke(s["messages"])]})
    graph.add_edge(START, "call_tool")
    graph.add_edge("call_tool", "tools")
    graph.add_edge("tools", "answer")
    graph.add_edge("answer", END)
    return graph.compile()


def main() -> None:
    task = json.loads(sys.stdin.read())
    state = build_graph().invoke({"messages": [("system", SYSTEM), ("user", task["input"]["question"])]})
    print(json.dumps({"output": {"answer": str(state["messages"][-1].content), "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()
