"""The ``tool_call`` scorer: the recorded tool call against BFCL-style accepted values, all or nothing or
with partial credit; the task set it scores (``flywheel tasks bfcl``) read from the real bfcl-eval wheel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from reward_service.feedback import FeedbackMapping
from reward_service.scoring import Scoring
from reward_service.state import EpisodeRecord
from schemas import CallChoice, ScorerSpec
from tests.unit.reward.calls import call, finished, started

pytestmark = pytest.mark.timeout(120)
EP = "b" * 32
# BFCL simple_python_0 and _2's ground truth, as bfcl-eval ships it
TRIANGLE: JsonValue = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
HYPOT: JsonValue = [{"math.hypot": {"x": [4], "y": [5], "z": ["", 0]}}]


def record(answer: JsonValue, *calls: tuple[str, Any], partial: bool = False) -> EpisodeRecord:
    rec = EpisodeRecord(EP)
    rec.add(started(EP, ScorerSpec(name="tool_call", options={"partial": partial}), answer=answer))
    ev = call(EP, 0, [1], [2])
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)},
            }
            for i, (n, a) in enumerate(calls)
        ],
    }
    rec.add(
        ev.model_copy(
            update={"choices": [CallChoice(index=0, message=message, token_ids=[2], logprobs=[-0.5])]}
        )
    )
    rec.add(finished(EP, None, None))
    return rec


async def score(rec: EpisodeRecord) -> tuple[float | None, str]:
    s = await Scoring(
        fill_value=-1.0, production_scorer="none", feedback=FeedbackMapping(), judge=None
    ).score(rec)
    assert s.source == "tool_call"
    return s.reward, s.note


@pytest.mark.parametrize(
    ("answer", "calls", "reward"),
    [
        (TRIANGLE, [("calculate_triangle_area", {"base": 10, "height": 5})], 1.0),  # optional left out
        (TRIANGLE, [("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})], 1.0),  # case
        (TRIANGLE, [("calculate_triangle_area", {"base": 10.0, "height": 5})], 1.0),  # 10.0 is 10
        (HYPOT, [("math_hypot", {"x": 4, "y": 5})], 1.0),  # "." offered as "_"
        (HYPOT, [("math_hypot", {"x": 4, "y": 5, "z": 0})], 1.0),
        (TRIANGLE, [("calculate_triangle_area", {"base": 10})], 0.0),  # a required one missing
        (TRIANGLE, [("calculate_triangle_area", {"base": 10, "height": 6})], 0.0),
        (TRIANGLE, [("calculate_triangle_area", {"base": 10, "height": 5, "colour": "red"})], 0.0),
        (TRIANGLE, [("calculate_area", {"base": 10, "height": 5})], 0.0),  # another function
        (TRIANGLE, [("calculate_triangle_area", "{not json")], 0.0),
        (TRIANGLE, [("calculate_triangle_area", {"base": True, "height": 5})], 0.0),  # a bool is no 10
        (TRIANGLE, [], 0.0),
        (TRIANGLE, [("calculate_triangle_area", {"base": 10, "height": 5})] * 2, 0.0),  # one call asked
    ],
)
async def test_all_or_nothing_as_bfcl_checks(
    answer: JsonValue, calls: list[tuple[str, Any]], reward: float
) -> None:
    got, note = await score(record(answer, *calls))
    assert got == reward, note
    assert note.startswith("correct") is (reward == 1.0)


async def test_partial_credit_half_for_the_function_the_rest_for_its_arguments() -> None:
    assert (await score(record(TRIANGLE, ("calculate_triangle_area", {"base": 10}), partial=True)))[
        0
    ] == pytest.approx(
        0.5 + 0.5 * 2 / 3  # base right, unit optional and left out, height missing
    )
    assert (await score(record(TRIANGLE, ("calculate_triangle_area", "[1]"), partial=True)))[0] == 0.5
    assert (await score(record(TRIANGLE, ("other", {"base": 10, "height": 5}), partial=True)))[0] == 0.0
    assert (
        await score(record(TRIANGLE, ("calculate_triangle_area", {"base": 10, "height": 5}), partial=True))
    )[0] == 1.0


async def test_an_answer_that_is_not_bfcls_shape_fails_to_score_with_the_reason() -> None:
    s = await Scoring(
        fill_value=-1.0, production_scorer="none", feedback=FeedbackMapping(), judge=None
    ).score(record("42", ("f", {})))
    assert s.reward is None and s.error is not None and "list of {function" in s.error


def test_the_bfcl_task_set_comes_from_the_pinned_wheel() -> None:
    from flywheel.bfcl import bfcl_tasks

    tasks = bfcl_tasks("simple_python")
    assert len(tasks) == 400 and len({t.task_id for t in tasks}) == 400
    first = tasks[0]
    assert first.scorer.name == "tool_call" and first.answer == TRIANGLE
    inputs: list[Any] = [t.input for t in tasks]
    [tool] = inputs[0]["tools"]
    assert tool["function"]["name"] == "calculate_triangle_area"
    assert tool["function"]["parameters"]["type"] == "object"  # BFCL's "dict"
    names = {t["function"]["name"] for spec in inputs for t in spec["tools"]}
    assert all("." not in n for n in names) and "math_factorial" in names
    assert len(bfcl_tasks("multiple", limit=5)) == 5


def test_flywheel_tasks_bfcl_writes_a_task_file_that_reads_back(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flywheel.cli.main import app
    from flywheel.taskfile import read_task_file

    out = tmp_path / "bfcl.jsonl"
    ran = CliRunner().invoke(app, ["tasks", "bfcl", "--limit", "3", "--partial", "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    tasks, errors = read_task_file(out)
    assert not errors and [t.task_id for t in tasks] == [f"bfcl-simple_python_{i}" for i in range(3)]
    assert all(t.scorer.name == "tool_call" and t.scorer.options == {"partial": True} for t in tasks)
    bad = CliRunner().invoke(app, ["tasks", "bfcl", "--category", "nope"])
    assert bad.exit_code == 1 and "category 'nope'" in bad.output
