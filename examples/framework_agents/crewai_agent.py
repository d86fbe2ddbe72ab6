"""A calculator crew in CrewAI (``Agent``/``Task``/``Crew`` with a ``@tool``, its ``LLM`` on the endpoint).

A plain CrewAI program: it knows nothing of Flywheel. The ``LLM`` points at ``OPENAI_BASE_URL`` with
``OPENAI_API_KEY``; the model name comes from ``OPENAI_MODEL`` (``openai/`` selects CrewAI's OpenAI
provider, which calls tools natively). Task JSON on stdin, result JSON as the last stdout line.
"""

from __future__ import annotations

import json
import os
import sys

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

TOOL_CALLS: list[dict[str, int]] = []


@tool("multiply")  # type: ignore[untyped-decorator,unused-ignore]
def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


def solve(question: str) -> str:
    llm = LLM(
        model=f"openai/{os.environ.get('OPENAI_MODEL', 'policy')}",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )
    calculator = Agent(
        role="Calculator",
        goal="Compute products exactly with the multiply tool",
        backstory="You never multiply in your head.",
        tools=[multiply],
        llm=llm,
        allow_delegation=False,
        max_iter=6,
    )
    task = Task(description=question, expected_output="The final product.", agent=calculator)
    return str(Crew(agents=[calculator], tasks=[task]).kickoff())


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = solve(task["input"]["question"])
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()
