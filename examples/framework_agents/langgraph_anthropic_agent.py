"""A ReAct calculator agent in LangGraph on Claude's API: ``ChatAnthropic`` node + ``ToolNode``.

The graph of ``langgraph_agent.py`` with LangChain's ``ChatAnthropic`` (``langchain-anthropic``) as its
model: it speaks Anthropic's Messages API and reads ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``; the
model name comes from ``ANTHROPIC_MODEL``. It knows nothing of Flywheel. Task JSON on stdin, result
JSON as the last stdout line.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

SYSTEM = "You are a calculator. Use the multiply tool for every product, then state the result."
TOOL_CALLS: list[dict[str, int]] = []


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


def build_graph() -> Any:
    model = ChatAnthropic(model=os.environ.get("ANTHROPIC_MODEL", "policy"), max_retries=1).bind_tools(
        [multiply]
    )

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode([multiply]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def solve(question: str) -> str:
    state = build_graph().invoke({"messages": [("user", question)]}, {"recursion_limit": 12})
    content = state["messages"][-1].content
    if isinstance(content, list):  # Claude's content blocks
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return str(content)


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = solve(task["input"]["question"])
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()
