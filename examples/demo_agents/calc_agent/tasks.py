"""Tasks for the calculator agent, in three disjoint splits, and a noisy teacher's demonstrations.

A problem is ``a <op> b`` with two-digit operands and ``op`` in ``+ - *``: 8,100 × 3 = 24,300 problems.
Each problem belongs to exactly one split by a fixed hash of ``(a, op, b)``:

* ``heldout`` (10 %): evaluation only, never trained on;
* ``sft`` (30 %): the teacher's demonstrations for the warm start;
* ``rl`` (60 %): the training tasks.

So held-out numbers are genuinely unseen: no held-out problem is in the SFT or RL data.

The teacher knows the protocol but is sloppy: at each turn it writes a malformed reply with probability
``p_format`` (the agent then asks again) and miscopies one digit of the expression or of the
calculator's result with probabilities ``p_copy_expr`` / ``p_copy_answer``. A model fine-tuned on its
demonstrations learns the protocol together with the sloppiness; reward, not more imitation, is what
tells it which of its habits pay.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from examples.demo_agents.calc_agent.agent import ERROR, MAX_CALLS, calculate, first_messages, react

OPS = ("+", "-", "*")
SPLITS = ("heldout", "sft", "rl")


def split_of(a: int, op: str, b: int) -> str:
    h = int.from_bytes(hashlib.sha256(f"{a}{op}{b}".encode()).digest()[:4], "big") % 10
    return "heldout" if h == 0 else ("sft" if h <= 3 else "rl")


def make_task(a: int, op: str, b: int) -> dict[str, Any]:
    expr = f"{a}{op}{b}"
    return {
        "task_id": f"calc-{a}{'pmx'[OPS.index(op)]}{b}",
        "input": {"question": f"What is {expr}?"},
        "answer": str(calculate(expr)),
        "scorer": {"name": "exact"},
    }


def tasks(split: str, seed: int) -> Iterator[dict[str, Any]]:
    """An endless stream of tasks of ``split`` in a random order given by ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    rng = random.Random(f"{split}-{seed}")
    while True:
        a, op, b = rng.randint(10, 99), rng.choice(OPS), rng.randint(10, 99)
        if split_of(a, op, b) == split:
            yield make_task(a, op, b)


def sample(split: str, seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` distinct tasks of ``split``."""
    out: dict[str, dict[str, Any]] = {}
    for task in tasks(split, seed):
        out.setdefault(task["task_id"], task)
        if len(out) == n:
            break
    return list(out.values())


def _miscopy(text: str, rng: random.Random) -> str:
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    if not digits:
        return text
    i = rng.choice(digits)
    first = i == 0 or not text[i - 1].isdigit()
    choices = [c for c in "0123456789" if c != text[i] and not (c == "0" and first)]
    return text[:i] + rng.choice(choices) + text[i + 1 :]


def _malformed(keyword: str, content: str, rng: random.Random) -> str:
    forms = (
        f"{keyword} {content}",
        f"{keyword.lower()}: {content}",
        content,
        f"{keyword}: {content} ?",
        f"{keyword}:{content}",
    )
    return rng.choice(forms)


def demonstration(
    task: dict[str, Any],
    rng: random.Random,
    *,
    p_format: float = 0.4,
    p_copy_expr: float = 0.35,
    p_copy_answer: float = 0.35,
) -> list[dict[str, str]]:
    """One conversation of the sloppy teacher on ``task``, as the agent would have run it."""
    question = task["input"]["question"]
    expression = question.removeprefix("What is ").removesuffix("?")
    messages = first_messages(question)
    result: str | None = None
    for _ in range(MAX_CALLS):
        if result is None:
            content = _miscopy(expression, rng) if rng.random() < p_copy_expr else expression
            reply = _malformed("CALC", content, rng) if rng.random() < p_format else f"CALC: {content}"
        else:
            content = _miscopy(result, rng) if rng.random() < p_copy_answer else result
            reply = _malformed("ANSWER", content, rng) if rng.random() < p_format else f"ANSWER: {content}"
        messages.append({"role": "assistant", "content": reply})
        kind, text = react(reply)
        if kind == "answer":
            break
        messages.append({"role": "user", "content": text})
        if kind == "calc":
            result = text.removeprefix("RESULT: ")
        else:
            assert text == ERROR
    return messages
