"""BFCL's function-calling questions as Flywheel tasks, from the ``bfcl-eval`` wheel on PyPI.

``bfcl-eval`` (Apache-2.0) ships the Berkeley Function Calling Leaderboard's questions
(``bfcl_eval/data/BFCL_v4_<category>.json``, one JSON object per line: ``id``, ``question`` — a list of
turns of chat messages — and ``function``, the functions offered) and their ground truth
(``data/possible_answer/…``: per expected call ``{function: {parameter: [accepted values]}}``). Only
those two files are read out of the zip; the package itself is not installed (it pins numpy 1.26).

Each question becomes a task: ``input`` holds the first turn's ``messages`` and the functions as OpenAI
``tools`` (BFCL's ``dict``/``float``/``tuple``/``any`` types as JSON Schema's ``object``/``number``/
``array``/any, ``.`` in a name as ``_`` as OpenAI's name pattern asks), ``answer`` the ground truth, and
the scorer is ``tool_call`` (reward_service/scorers.py), which compares the model's call with the
accepted values as BFCL's AST checker does. Categories with one expected call per question:
``simple_python`` (400), ``simple_java``, ``simple_javascript``, ``live_simple``, ``multiple`` (several
functions offered, one to call).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from infra.wheels import WheelError, pinned_wheel
from schemas import ScorerSpec, Task

REQUIREMENT = "bfcl-eval==2026.3.23"
WHEEL = "bfcl_eval-2026.3.23-py3-none-any.whl"
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
CATEGORIES = ("simple_python", "simple_java", "simple_javascript", "live_simple", "multiple")
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


class BfclError(RuntimeError):
    """The wheel could not be had, or its data is not what this reader expects."""


def default_wheel_dir() -> Path:
    root = os.environ.get("FLYWHEEL_WHEEL_CACHE") or str(Path.home() / ".cache" / "flywheel" / "wheels")
    return Path(root)


def bfcl_tasks(
    category: str = "simple_python",
    *,
    wheel: Path | None = None,
    limit: int | None = None,
    partial: bool = False,
) -> list[Task]:
    """The category's questions with ground truth, in BFCL's order (the first ``limit``); ``partial``: the
    scorer gives partial credit (the right function, some arguments right) instead of BFCL's all or
    nothing, a denser signal for a small model."""
    if category not in CATEGORIES:
        raise BfclError(f"category {category!r}: one of {', '.join(CATEGORIES)}")
    try:
        path = pinned_wheel(REQUIREMENT, WHEEL, WHEEL_SHA256, default_wheel_dir(), given=wheel)
    except WheelError as exc:
        raise BfclError(str(exc)) from exc
    with zipfile.ZipFile(path) as zf:
        questions = _lines(zf, f"bfcl_eval/data/BFCL_v4_{category}.json")
        answers = {
            a["id"]: a["ground_truth"]
            for a in _lines(zf, f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json")
        }
    tasks = []
    for q in questions:
        if q["id"] not in answers:
            continue  # BFCL keeps a few questions without ground truth
        tasks.append(
            Task(
                task_id=f"bfcl-{q['id']}",
                input={"messages": q["question"][0], "tools": [tool(f) for f in q["function"]]},
                answer=answers[q["id"]],
                scorer=ScorerSpec(name="tool_call", options={"partial": True} if partial else {}),
                metadata={"source": "bfcl", "category": category},
            )
        )
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def _lines(zf: zipfile.ZipFile, name: str) -> list[dict[str, Any]]:
    try:
        text = zf.read(name).decode()
    except KeyError as exc:
        raise BfclError(f"{zf.filename} holds no {name}") from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI tool."""
    return {
        "type": "function",
        "function": {
            "name": str(function["name"]).replace(".", "_"),
            "description": function.get("description", ""),
            "parameters": _schema(function.get("parameters") or {"type": "object", "properties": {}}),
        },
    }


def _schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items() if not (k == "type" and v == "any")}
    if isinstance(out.get("type"), str):
        out["type"] = _TYPES.get(out["type"], out["type"])
    return out
