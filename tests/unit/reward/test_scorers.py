"""Scorers: agent-reported, exact, numeric, regex, SQL execution match, user functions, LLM judge."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from pydantic import JsonValue

from reward_service.feedback import FeedbackMapping
from reward_service.judge import Judge
from reward_service.scoring import Scoring
from reward_service.state import EpisodeRecord
from schemas import RewardOrigin, RewardReported, ScorerSpec
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream
from tests.unit.reward.calls import call, finished, started

EP = "a" * 32


def record(
    spec: ScorerSpec,
    output: JsonValue = None,
    *,
    answer: JsonValue = None,
    reward: float | None = None,
    metadata: dict[str, str] | None = None,
    last: str = "",
) -> EpisodeRecord:
    rec = EpisodeRecord(EP)
    rec.add(started(EP, spec, answer=answer, metadata=metadata))
    rec.add(call(EP, 0, [1], [2], content=last))
    rec.add(finished(EP, output, reward))
    return rec


def scoring(judge: Judge | None = None) -> Scoring:
    return Scoring(fill_value=-1.0, production_scorer="none", feedback=FeedbackMapping(), judge=judge)


async def test_agent_reward_last_one_wins_and_fill() -> None:
    rec = record(ScorerSpec(name="agent"))
    rec.add(RewardReported(episode_id=EP, value=0.2))
    rec.add(RewardReported(episode_id=EP, value=0.7))
    assert await scoring().score(rec) == type(await scoring().score(rec))(0.7, "agent")
    rec2 = record(ScorerSpec(name="agent"), reward=0.9)
    rec2.add(RewardReported(episode_id=EP, value=0.2))
    assert (await scoring().score(rec2)).reward == 0.9  # the final line came last
    filled = await scoring().score(record(ScorerSpec(name="agent")))
    assert (filled.reward, filled.source) == (-1.0, "filled")
    opt = await scoring().score(record(ScorerSpec(name="agent", options={"fill": 0.5})))
    assert (opt.reward, opt.source) == (0.5, "filled")


@pytest.mark.parametrize(
    ("spec", "output", "answer", "expected"),
    [
        (ScorerSpec(name="exact"), " 85 ", "85", 1.0),
        (ScorerSpec(name="exact"), {"answer": "Paris"}, ["paris", "Paris"], 1.0),
        (ScorerSpec(name="exact", options={"ignore_case": True}), "PARIS", "paris", 1.0),
        (ScorerSpec(name="exact"), "86", "85", 0.0),
        (ScorerSpec(name="numeric"), "The answer is 1,234.5", 1234.5, 1.0),
        (ScorerSpec(name="numeric", options={"tolerance": 0.1}), "3.05", "3", 1.0),
        (ScorerSpec(name="numeric"), "no number", 3, 0.0),
        (ScorerSpec(name="regex", options={"pattern": r"\b42\b"}), "it is 42.", None, 1.0),
        (ScorerSpec(name="regex", options={"full": True}), "abc", "a.c", 1.0),
        (ScorerSpec(name="regex"), "xyz", "a.c", 0.0),
    ],
)
async def test_match_scorers(spec: ScorerSpec, output: JsonValue, answer: JsonValue, expected: float) -> None:
    outcome = await scoring().score(record(spec, output, answer=answer))
    assert outcome.error is None and outcome.reward == expected and outcome.source == spec.name


async def test_answer_falls_back_to_the_last_model_message() -> None:
    outcome = await scoring().score(
        record(ScorerSpec(name="exact"), None, answer="The answer is 42.", last="The answer is 42.")
    )
    assert outcome.reward == 1.0


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "concert.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE singer (id INTEGER, name TEXT, age INTEGER);"
        "INSERT INTO singer VALUES (1, 'Ann', 30), (2, 'Bo', 40), (3, 'Cy', 40);"
    )
    conn.commit()
    conn.close()
    return str(path)


async def test_sql_execution_match(db: str) -> None:
    gold = "SELECT name FROM singer WHERE age = 40"
    spec = ScorerSpec(name="sql", options={"db": db})
    same = await scoring().score(
        record(spec, {"sql": "select name from singer where age > 35 order by name desc"}, answer=gold)
    )
    assert same.reward == 1.0 and same.source == "sql"
    fenced = await scoring().score(
        record(spec, "```sql\nSELECT name FROM singer WHERE age=40;\n```", answer=gold)
    )
    assert fenced.reward == 1.0
    wrong = await scoring().score(record(spec, "SELECT name FROM singer", answer=gold))
    assert wrong.reward == 0.0
    broken = await scoring().score(record(spec, "SELEC nonsense", answer=gold))
    assert broken.reward == 0.0 and broken.error is None  # a bad prediction is a wrong answer
    ordered = ScorerSpec(name="sql", options={"db": db, "ordered": True})
    flipped = await scoring().score(
        record(
            ordered, "SELECT name FROM singer WHERE age=40 ORDER BY name DESC", answer=gold + " ORDER BY name"
        )
    )
    assert flipped.reward == 0.0
    via_meta = await scoring().score(record(ScorerSpec(name="sql"), gold, answer=gold, metadata={"db": db}))
    assert via_meta.reward == 1.0
    bad_gold = await scoring().score(record(spec, gold, answer="SELECT nope FROM nowhere"))
    assert bad_gold.reward is None and bad_gold.error is not None and "gold" in bad_gold.error


async def test_user_functions_and_failures() -> None:
    mod = "tests.unit.reward.user_scorers"
    ok = await scoring().score(record(ScorerSpec(name="function", ref=f"{mod}:length_score"), last="done"))
    assert (ok.reward, ok.source) == (2.0, "function")
    assert (
        await scoring().score(record(ScorerSpec(name="function", ref=f"{mod}:async_score")))
    ).reward == 0.25
    for ref in [f"{mod}:explodes", f"{mod}:not_a_number", "nowhere_module:fn", None]:
        failed = await scoring().score(record(ScorerSpec(name="function", ref=ref)))
        assert failed.reward is None and failed.error, ref
    unknown = await scoring().score(record(ScorerSpec(name="vibes")))
    assert unknown.reward is None and "unknown scorer" in (unknown.error or "")


def judge_with(reply: str) -> tuple[Judge, FakeUpstreamConfig]:
    cfg = FakeUpstreamConfig(reply=reply, use_tools=False)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_fake_upstream(cfg)), base_url="http://fake/v1/"
    )
    return Judge(client, model="judge"), cfg


async def test_llm_judge_scores_through_an_openai_endpoint() -> None:
    judge, cfg = judge_with("Looks right. SCORE: 0.8")
    outcome = await scoring(judge).score(record(ScorerSpec(name="judge"), "Paris", answer="Paris"))
    assert (outcome.reward, outcome.source) == (0.8, "judge")
    prompt = cfg.requests[-1]["messages"][-1]["content"]
    assert "Paris" in prompt and "SCORE" in prompt
    judge, _ = judge_with("SCORE: 7")
    assert (await scoring(judge).score(record(ScorerSpec(name="judge"), "x"))).reward == 0.7
    judge, _ = judge_with("I refuse")
    failed = await scoring(judge).score(record(ScorerSpec(name="judge"), "x"))
    assert failed.reward is None and "SCORE" in (failed.error or "")
    judge, cfg = judge_with("SCORE: 1")
    cfg.fail_next = [500]
    errored = await scoring(judge).score(record(ScorerSpec(name="judge"), "x"))
    assert errored.reward is None and "HTTP 500" in (errored.error or "")


async def test_llm_judge_ranks_a_group() -> None:
    judge, cfg = judge_with("RANKING: B > C > A")
    spec = ScorerSpec(name="judge", options={"mode": "rank"})
    recs = [record(spec, out) for out in ["worst", "best", "middle"]]
    outcomes = await scoring(judge).rank(recs, spec)
    assert [o.reward for o in outcomes] == [0.0, 1.0, 0.5]
    assert "Answer B: best" in cfg.requests[-1]["messages"][-1]["content"]
    judge, _ = judge_with("RANKING: B > A")  # C missing: the whole group fails to score
    bad = await scoring(judge).rank(recs, spec)
    assert all(o.reward is None and o.error for o in bad)


def test_feedback_mapping() -> None:
    fb = FeedbackMapping()
    thumbs = [RewardReported(episode_id=EP, origin=RewardOrigin.feedback, rating=r) for r in (-1, 1)]
    assert [fb.reward(r) for r in thumbs] == [0.0, 1.0]
    assert fb.episode_reward(thumbs) == 1.0
    stars = FeedbackMapping(scale="stars", stars_max=5, ratings={"3": 0.9})
    assert [
        stars.reward(RewardReported(episode_id=EP, origin=RewardOrigin.feedback, rating=r))
        for r in (1, 3, 5, 9)
    ] == [0.0, 0.9, 1.0, None]
    assert fb.reward(RewardReported(episode_id=EP, origin=RewardOrigin.feedback, value=0.3, rating=1)) == 0.3


async def test_a_scorer_that_hangs_is_timed_out() -> None:
    slow = Scoring(
        fill_value=0.0, production_scorer="none", feedback=FeedbackMapping(), judge=None, timeout_s=0.1
    )
    spec = ScorerSpec(name="function", ref="tests.unit.reward.user_scorers:slow")
    outcome = await slow.score(record(spec))
    assert outcome.reward is None and "timed out" in (outcome.error or "")


async def test_exact_and_numeric_say_why_in_words() -> None:
    """The reason travels as ``EpisodeScored.score_note``: the feedback prompt optimisation reflects on."""
    wrong = await scoring().score(record(ScorerSpec(name="exact"), {"answer": "86"}, answer="85"))
    assert wrong.reward == 0.0 and wrong.note == "expected '85', got '86'"
    right = await scoring().score(record(ScorerSpec(name="numeric"), "about 85", answer=85))
    assert right.reward == 1.0 and right.note.startswith("correct")
    empty = await scoring().score(record(ScorerSpec(name="exact"), {"answer": ""}, answer="85"))
    assert empty.note == "expected '85', got no answer"


async def test_sql_compares_values_not_their_text_and_orders_like_spider(tmp_path: Path) -> None:
    """``2`` and ``2.0`` are the same number, NULLs match NULLs, and a gold ``ORDER BY`` makes row order
    count (Spider's rule) while an unordered gold compares multisets."""
    path = tmp_path / "m.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE t (name TEXT, a INTEGER, b REAL);"
        "INSERT INTO t VALUES ('x', 2, 2.0), ('y', 4, NULL), ('z', 3, 0.1);"
    )
    conn.commit()
    conn.close()
    meta = {"db": str(path)}
    spec = ScorerSpec(name="sql")

    async def score(pred: str, gold: str) -> float | None:
        return (await scoring().score(record(spec, {"sql": pred}, answer=gold, metadata=meta))).reward

    assert await score("SELECT a FROM t WHERE name = 'x'", "SELECT b FROM t WHERE name = 'x'") == 1.0
    assert await score("SELECT AVG(a) FROM t WHERE a < 4", "SELECT 5 / 2.0") == 1.0
    assert await score("SELECT 0.1 + 0.2", "SELECT 0.3") == 1.0  # float summation noise
    assert await score("SELECT b FROM t", "SELECT b FROM t WHERE b IS NOT NULL") == 0.0
    assert await score("SELECT name, b FROM t", "SELECT name, b FROM t ORDER BY a DESC") == 0.0
    assert await score("SELECT name FROM t ORDER BY a DESC", "SELECT name FROM t ORDER BY a DESC") == 1.0
    assert await score("SELECT name FROM t ORDER BY a", "SELECT name FROM t") == 1.0
    assert await score("SELECT 'order by'", "SELECT 'order by'") == 1.0
    unordered = ScorerSpec(name="sql", options={"ordered": False})
    flipped = await scoring().score(
        record(
            unordered,
            "SELECT name FROM t ORDER BY a",
            answer="SELECT name FROM t ORDER BY a DESC",
            metadata=meta,
        )
    )
    assert flipped.reward == 1.0


def test_scorer_options_are_typed_and_checked_when_the_task_is_parsed(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from flywheel.taskfile import read_task_file
    from schemas.scorers import NumericOptions, SqlOptions

    spec = ScorerSpec(name="numeric", options={"tolerance": 0.5})
    assert spec.options_as(NumericOptions).tolerance == 0.5
    assert ScorerSpec(name="sql").options_as(SqlOptions).ordered == "auto"
    for bad, where in (
        ({"tolerence": 0.5}, "options.tolerence"),
        ({"tolerance": "small"}, "options.tolerance"),
    ):
        with pytest.raises(ValidationError, match=where):
            ScorerSpec(name="numeric", options=bad)
    # a name no built-in knows keeps its options as they are (the service answers UnknownScorer)
    assert ScorerSpec(name="mine", options={"x": [1]}).options == {"x": [1]}
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"task_id": "a", "scorer": {"name": "regex", "options": {"pattern": "4", "full": true}}}\n'
        '{"task_id": "b", "scorer": {"name": "regex", "options": {"patern": "4"}}}\n'
    )
    tasks, errors = read_task_file(path)
    assert [t.task_id for t in tasks] == ["a"]
    assert (
        len(errors) == 1 and errors[0].startswith(f"{path}:2: not a task:") and "options.patern" in errors[0]
    )
