"""``flywheel demo --agent sql``: the LangGraph SQL agent of ``examples/demo_agents/sql_agent``, on generated databases.

The data is ``examples/demo_agents/sql_agent/data.py``'s Spider-style benchmark, generated once per recipe under the
demo cache (``<cache>/sql-data/<seed>-<databases>x<questions>/``) and split **by database**: SFT, RL and
the gate use the train databases only; held-out questions are asked on databases none of them touched.

The warm start is SFT on the sloppy teacher (``sloppy_teacher``: the gold query, or with
``mistake_rate`` a deliberate mistake followed by a rewriter demonstration that fixes it), plus checker
demonstrations (one written query in ``CHECKER_SHARE``) in the agent's exact checker format: ``CORRECT``
when the query ran, ``WRONG`` when SQLite refused it. The checker is therefore lenient (it passes any query that runs).
It is a fixed model, as a multi-agent program's frozen role would be: the gateway routes the model name
``checker`` to a second engine serving the warm start, which never loads a new version, and its calls are
recorded as context but never trained (``train_models = "writer,rewriter"``). What RL can improve is the
writer's first query (no mistakes left for the checker to miss, no failing query to rewrite: fewer
calls per episode) and the rewriter's fixes.

The gate runs the writer alone on train-database questions (one query, execution match), in-process.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from examples.demo.warmconfig import GateConfig, WarmStartConfig, sample_replies
from examples.demo_agents.sql_agent.data import Benchmark, Split, generate, sloppy_teacher
from examples.demo_agents.sql_agent.prompts import (
    checker_messages,
    execute,
    extract_sql,
    schema_of,
    writer_messages,
)
from schemas import AgentKind, AgentRef, Task

# data.py's version, in the warm start's key (WarmStartConfig.data_format) and the data's folder: bump it
# when the benchmark or the teacher changes. 2: a teacher's mistake always changes the query.
DATA_FORMAT = 2
MAX_TOKENS = 96  # the agent's SQL_AGENT_MAX_TOKENS default
CHECKER_OK = "CORRECT"
CHECKER_FAILED = "WRONG: the query failed."
# The per-call discount of RL's tasks (reward_service/transitions.py): the writer's return is the episode's
# reward times RL_DISCOUNT per call after it, so a success through the rewriter pays the writer 0.64, one
# at once 1. Without it RL learned to lean on the rewriter, whose fixes are nearly always right
# (docs/results/tuning.md).
RL_DISCOUNT = 0.8
CHECKER_SHARE = 4  # one checker demonstration in CHECKER_SHARE goes into the warm start

_BENCHES: dict[Path, Benchmark] = {}
_LOCK = threading.Lock()  # the warm start runs in a thread while the event loop may ask for tasks


SQL_REF = AgentRef(kind=AgentKind.callable, spec="examples.demo_agents.sql_agent.agent:run")
# hidden 128 × 4 layers, vocabulary 1024 (874 used: every table, column and keyword one token).
# The skill from SFT; a teacher whose mistake always changes the query, 80% of the time
# (examples/demo_agents/sql_agent/data.py); 1,500 steps (a warm start of ~7 minutes, so that the demo's
# 15 minutes from a fresh clone hold); RL left to drop the mistakes; 240 databases (180 for SFT and RL).
# The runs that chose these: docs/results/tuning.md.
SQL_WARM = WarmStartConfig(
    agent="sql",
    hidden=128,
    layers=4,
    vocab_size=1024,
    demos=0,
    sft_steps=1500,
    sft_batch=24,
    sft_lr=3e-3,
    databases=240,
    questions_per_db=12,
    mistake_rate=0.8,
    data_format=DATA_FORMAT,
)
# The gate checks that SFT has converged: the writer alone solves at least 30% of train-database questions
# (this teacher's own writer 25–26%: greedy decoding copies the teacher's majority, the right query). A
# model below the bar is topped up (SFT continued at half the peak rate), never re-initialised: a model
# that passed lower was still learning from imitation (docs/results/tuning.md).
SQL_GATE = GateConfig(
    min_success=0.30,
    tasks=128,
    max_attempts=1,
    reinit_below=0.0,
    top_up_steps=400,
    max_top_ups=2,
    top_up_lr_scale=0.5,
)
# The smoke runs' toy: 600 SFT steps (~25 s on one thread) on the 24 train questions of 6 databases,
# enough to copy some of them (its writer alone solved 58% of them, sampled; 300 steps: 21%), so RL's
# rewards vary and the trainer has groups to learn from; it knows nothing of the held-out databases.
SQL_TINY = WarmStartConfig(
    agent="sql",
    hidden=64,
    layers=2,
    vocab_size=1024,
    demos=0,
    sft_steps=600,
    sft_batch=8,
    databases=8,
    questions_per_db=4,
    mistake_rate=0.3,
    data_format=DATA_FORMAT,
    # the toy can write 96 tokens of noise, and the rewriter's prompt repeats it with SQLite's error: past
    # 512 positions the engine refuses the call
    max_positions=1024,
)
SQL_TINY_GATE = GateConfig(min_success=0.0)  # no gate: the toy is not expected to pass anything


@dataclass(frozen=True)
class SqlDemo:
    data_root: Path
    name: str = "sql"
    ref: AgentRef = SQL_REF
    title: str = "LangGraph SQL agent (writer, rewriter trained; checker fixed)"
    train_models: str = "writer,rewriter"
    fixed_models: tuple[str, ...] = ("checker",)
    eval_tasks: int = 512  # of the 720 held-out questions: 256 were too noisy (docs/results/tuning.md)
    # 3e-4 collapsed after a quick climb; 2e-4 climbs steadily (docs/results/tuning.md).
    learning_rate: float = 2e-4
    # The demo's 15 minutes from a fresh clone: ~6 for the warm start, ~2 for the stack and two
    # evaluations, 6.5 of RL.
    rl_seconds: float = 390.0
    warm: WarmStartConfig = SQL_WARM
    tiny_warm: WarmStartConfig = SQL_TINY
    gate: GateConfig = SQL_GATE
    tiny_gate: GateConfig = SQL_TINY_GATE

    # ------------------------------------------------------------------ data
    def split(self, cfg: WarmStartConfig) -> Split:
        return self.bench(cfg).split(held_out=0.25)

    def bench(self, cfg: WarmStartConfig) -> Benchmark:
        """The generated benchmark of this recipe (written once; the same seed, the same files)."""
        out = self.data_root / f"{cfg.seed}-{cfg.databases}x{cfg.questions_per_db}-v{cfg.data_format}"
        with _LOCK:  # generating is deterministic and takes ~1 s: once per process, before any episode
            bench = _BENCHES.get(out)
            if bench is None:
                bench = _BENCHES[out] = generate(
                    out, seed=cfg.seed, databases=cfg.databases, questions_per_db=cfg.questions_per_db
                )
            return bench

    def rl_tasks(self, cfg: WarmStartConfig) -> Iterator[Task]:
        """The train databases' questions, reshuffled every pass, forever, scored with the per-call
        ``discount`` (RL_DISCOUNT): a query the rewriter had to fix earns the writer less than one right
        the first time."""
        pool = [_discounted(e.task(), RL_DISCOUNT) for e in self.split(cfg).train]
        rng = random.Random(f"rl-{cfg.seed}")
        while True:
            rng.shuffle(pool)
            for raw in pool:
                yield Task.model_validate(raw)

    def heldout(self, cfg: WarmStartConfig, n: int) -> list[Task]:
        test = list(self.split(cfg).test)
        random.Random(f"heldout-{cfg.seed}").shuffle(test)
        return [Task.model_validate(e.task()) for e in test[:n]]

    # ------------------------------------------------------------------ warm start
    def demonstrations(self, cfg: WarmStartConfig) -> list[list[dict[str, str]]]:
        train = self.split(cfg).train
        demos = [d["messages"] for d in sloppy_teacher(train, seed=cfg.seed, mistake_rate=cfg.mistake_rate)]
        dbs = {schema_of(db): db for db in sorted({e.db for e in train})}
        checker = _checker_demos(demos, dbs)
        # The checker's replies are two fixed strings: a quarter of its demonstrations teach them as well
        # as all of them, and leave the SFT batches to the writer and the rewriter.
        random.Random(f"checker-{cfg.seed}").shuffle(checker)
        return demos + checker[: len(checker) // CHECKER_SHARE]

    def corpus(self, cfg: WarmStartConfig) -> list[str]:
        return [m["content"] for d in self.demonstrations(cfg) for m in d] + ["system", "user", "assistant"]

    def gate_tasks(self, cfg: WarmStartConfig, n: int) -> list[dict[str, Any]]:
        train = list(self.split(cfg).train)
        random.Random(f"gate-{cfg.seed}").shuffle(train)
        return [e.task() for e in train[:n]]

    def gate_success(self, model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], seed: int) -> float:
        """The share of ``tasks`` whose writer query (one call, temperature 1 as the agent samples it)
        returns the gold query's rows; batched ``generate`` in-process."""
        torch.manual_seed(seed)
        solved = 0
        for start in range(0, len(tasks), 64):
            chunk = tasks[start : start + 64]
            convs = [writer_messages(schema_of(t["input"]["db"]), t["input"]["question"]) for t in chunk]
            replies = sample_replies(model, tokenizer, convs, MAX_TOKENS)
            for reply, task in zip(replies, chunk, strict=True):
                solved += same_result(task["input"]["db"], extract_sql(reply), str(task["answer"]))
        return solved / max(1, len(tasks))


def _discounted(task: dict[str, Any], discount: float) -> dict[str, Any]:
    scorer = task["scorer"]
    return {**task, "scorer": {**scorer, "options": {**scorer.get("options", {}), "discount": discount}}}


def same_result(db: str, sql: str, gold: str) -> bool:
    """Execution match as the reward service's ``sql`` scorer does it (rows in order when the gold query
    orders them, as multisets otherwise); a check for the gate, not the demo's metric."""
    got, _ = execute(db, sql)
    want, _ = execute(db, gold)
    if got is None or want is None:
        return False
    if "ORDER BY" in gold.upper():
        return got == want
    return Counter(got) == Counter(want)


def _checker_demos(
    demos: Sequence[Sequence[dict[str, str]]], dbs: dict[str, str]
) -> list[list[dict[str, str]]]:
    """One checker turn per written query (the writer's and the rewriter's): CORRECT when it ran.
    ``dbs`` maps a schema's text (as the prompts show it) to its database file."""
    out: list[list[dict[str, str]]] = []
    for messages in demos:
        user = messages[1]["content"]
        db_question = user.split("\nQuestion: ", 1)
        if len(db_question) != 2:
            continue
        question = db_question[1].split("\nQuery: ", 1)[0]
        query = messages[-1]["content"]
        db = dbs.get(db_question[0])
        if db is None:
            continue
        rows, preview = execute(db, query)
        reply = CHECKER_OK if rows is not None else CHECKER_FAILED
        out.append([*checker_messages(question, query, preview), {"role": "assistant", "content": reply}])
    return out
