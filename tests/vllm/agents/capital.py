"""A LangChain agent in the worker's process (``tests.vllm.agents.capital:run``): one ``ChatOpenAI`` call
at the episode's URL, the question from the task, the reply as the episode's output."""

from __future__ import annotations

from typing import Any

from langchain_openai import ChatOpenAI


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    chat = ChatOpenAI(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        temperature=1.0,
        max_tokens=12,
        max_retries=0,
    )
    reply = await chat.ainvoke(str(task["input"]["question"]))
    return {"output": str(reply.content)}


def score(view: dict[str, Any]) -> float:
    """1 for naming Paris, less a little per character: every group of replies has a signal."""
    text = str(view.get("output") or "")
    return (1.0 if "paris" in text.lower() else 0.0) - 0.01 * len(text)
