"""The Spider-style generator: deterministic, cross-database split, every gold query runs, the ``sql``
scorer tells gold from perturbed queries, the sloppy teacher writes the agent's chat format."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from examples.demo_agents.sql_agent.data import TEMPLATES, Benchmark, generate, sloppy_teacher
from examples.demo_agents.sql_agent.prompts import (
    REWRITER_SYSTEM,
    WRITER_SYSTEM,
    execute,
    extract_sql,
    schema_of,
)
from reward_service.feedback import FeedbackMapping
from reward_service.scoring import Scoring
from schemas import ScorerSpec, Task
from tests.unit.reward.scorer_records import sql_record


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Benchmark:
    return generate(tmp_path_factory.mktemp("sql"), seed=3, databases=12, questions_per_db=12)


def _dump(db: str) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_same_seed_same_benchmark_other_seed_other(bench: Benchmark, tmp_path: Path) -> None:
    again = generate(tmp_path / "a", seed=3, databases=12, questions_per_db=12)
    assert [(e.task_id, e.question, e.gold) for e in again.examples] == [
        (e.task_id, e.question, e.gold) for e in bench.examples
    ]
    assert _dump(again.examples[0].db) == _dump(bench.examples[0].db)
    other = generate(tmp_path / "b", seed=4, databases=12, questions_per_db=12)
    assert [e.gold for e in other.examples] != [e.gold for e in bench.examples]
    assert len({schema_of(e.db) for e in bench.examples}) > 6  # databases differ in schema, not just rows


def test_split_is_cross_database(bench: Benchmark) -> None:
    split = bench.split(held_out=0.25)
    train_dbs = {e.db_id for e in split.train}
    test_dbs = {e.db_id for e in split.test}
    assert train_dbs and test_dbs and not train_dbs & test_dbs
    assert len(split.train) + len(split.test) == len(bench.examples) == 12 * 12
    assert len(test_dbs) == 3
    assert bench.split(0.25).test == split.test  # deterministic
    assert {e.template for e in split.test} == set(TEMPLATES)


def test_every_gold_query_runs_and_answers_something(bench: Benchmark) -> None:
    for e in bench.examples:
        rows, preview = execute(e.db, e.gold)
        assert rows, (e.question, e.gold, preview)
        assert Task.model_validate(e.task()).answer == e.gold
    per_db: dict[str, set[str]] = {e.db_id: set() for e in bench.examples}
    for e in bench.examples:
        assert e.question not in per_db[e.db_id]
        per_db[e.db_id].add(e.question)


def _scoring() -> Scoring:
    return Scoring(fill_value=0.0, production_scorer="none", feedback=FeedbackMapping(), judge=None)


async def test_scorer_accepts_gold_and_rejects_perturbed(bench: Benchmark) -> None:
    spec = ScorerSpec(name="sql")
    checked = 0
    for e in bench.examples[:40]:
        meta = {"db": e.db}
        same = await _scoring().score(sql_record(spec, {"sql": e.gold}, e.gold, meta))
        assert same.reward == 1.0, e.gold
        perturbed = e.gold.replace("COUNT(*)", "COUNT(*) + 1").replace(" DESC", " ASC", 1)
        if " WHERE " in perturbed:
            perturbed = perturbed.split(" WHERE ")[0]
        if perturbed == e.gold:
            continue
        rows_gold, _ = execute(e.db, e.gold)
        rows_bad, _ = execute(e.db, perturbed)
        if sorted(map(repr, rows_gold or [])) == sorted(map(repr, rows_bad or [])):
            continue  # the perturbation happens to give the same rows: equal by execution, rightly
        wrong = await _scoring().score(sql_record(spec, {"sql": perturbed}, e.gold, meta))
        assert wrong.reward == 0.0, (e.gold, perturbed)
        checked += 1
    assert checked >= 20


def test_sloppy_teacher_writes_the_agents_format_with_mistakes(bench: Benchmark) -> None:
    train = bench.split(0.25).train
    demos = sloppy_teacher(train, seed=1, mistake_rate=0.3)
    assert demos == sloppy_teacher(train, seed=1, mistake_rate=0.3)
    writers = [d for d in demos if d["role"] == "writer"]
    rewriters = [d for d in demos if d["role"] == "rewriter"]
    assert len(writers) == len(train)
    assert 0.15 * len(train) < len(rewriters) < 0.45 * len(train)
    by_prompt = {f"{schema_of(e.db)}\nQuestion: {e.question}": e for e in train}
    wrong = 0
    for d in writers:
        system, user, reply = d["messages"]
        assert system == {"role": "system", "content": WRITER_SYSTEM} and reply["role"] == "assistant"
        ex = by_prompt[user["content"]]  # exactly the prompt the agent sends for this question
        wrong += extract_sql(reply["content"]) != ex.gold
    assert wrong == len(rewriters)
    for d in rewriters:
        assert d["messages"][0]["content"] == REWRITER_SYSTEM and "Problem: " in d["messages"][1]["content"]


def test_a_teachers_mistake_always_changes_the_query(bench: Benchmark) -> None:
    """Every question shape is written wrong at the mistake rate: a kind that would leave the query as it
    is (no ORDER BY to flip, no LIMIT to drop) gives way to one that changes it."""
    train = bench.split(0.25).train
    demos = sloppy_teacher(train, seed=3, mistake_rate=1.0)
    writers = [d for d in demos if d["role"] == "writer"]
    assert len(writers) == len(train)
    assert all(d["messages"][-1]["content"] != e.gold for d, e in zip(writers, train, strict=True))
    assert sum(d["role"] == "rewriter" for d in demos) == len(train)


def _generate_into(out: str) -> list[str]:
    return [e.gold for e in generate(Path(out), seed=3, databases=12, questions_per_db=12).examples]


def test_two_processes_generating_one_recipe_at_once_both_succeed(bench: Benchmark, tmp_path: Path) -> None:
    """Two demos sharing a cache generate the same files at once: each database is built aside and moved
    into place, so neither sees another's half-written file (it used to fail with "disk I/O error")."""
    import multiprocessing

    out = tmp_path / "shared"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = [pool.apply_async(_generate_into, (str(out),)) for _ in range(4)]
        golds = [r.get(timeout=120) for r in results]
    assert all(g == [e.gold for e in bench.examples] for g in golds)
    assert _dump(str(out / Path(bench.examples[0].db).name)) == _dump(bench.examples[0].db)
    assert not list(out.glob(".*.tmp"))  # nothing left aside
