"""The SQL demo's data hooks: RL's tasks (train databases, the per-call discount), the held-out tasks
(other databases, no discount) and the warm start's demonstrations (a share of the checker's)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from examples.demo.sql_demo import CHECKER_SHARE, RL_DISCOUNT, SQL_TINY, SqlDemo
from examples.demo_agents.sql_agent.prompts import CHECKER_SYSTEM
from schemas import Task
from schemas.scorers import ScorerOptions

pytestmark = pytest.mark.timeout(120)


def _db(task: Task) -> str:
    data = task.input
    assert isinstance(data, dict) and isinstance(data["db"], str)
    return data["db"]


def test_rl_tasks_are_discounted_on_train_databases_and_heldout_ones_are_not(tmp_path: Path) -> None:
    demo = SqlDemo(data_root=tmp_path)
    split = demo.split(SQL_TINY)
    train_dbs = {e.db for e in split.train}
    rl = list(itertools.islice(demo.rl_tasks(SQL_TINY), 2 * len(split.train)))
    assert {t.task_id for t in rl} == {e.task_id for e in split.train}  # every question, again and again
    for task in rl:
        assert _db(task) in train_dbs
        assert task.scorer.name == "sql"
        assert task.scorer.options_as(ScorerOptions).discount == RL_DISCOUNT
    heldout = demo.heldout(SQL_TINY, 100)
    assert heldout and not {_db(t) for t in heldout} & train_dbs
    assert all(t.scorer.options_as(ScorerOptions).discount is None for t in heldout)


def test_the_warm_start_gets_a_share_of_the_checker_demonstrations(tmp_path: Path) -> None:
    demo = SqlDemo(data_root=tmp_path)
    demos = demo.demonstrations(SQL_TINY)
    checker = [d for d in demos if d[0]["content"] == CHECKER_SYSTEM]
    written = [d for d in demos if d[0]["content"] != CHECKER_SYSTEM]  # writer and rewriter turns
    assert checker and len(checker) == len(written) // CHECKER_SHARE
    assert {d[-1]["content"].split(":")[0] for d in checker} <= {"CORRECT", "WRONG"}
