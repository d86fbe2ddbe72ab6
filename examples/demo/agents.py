"""What ``flywheel demo`` needs to know about the agent it trains: one small definition per agent.

The demo's path (warm start → held-out eval → RL through the embedded stack → eval → SFT-only baseline)
is the same for every agent; what differs is listed by :class:`DemoAgent`:

* ``ref``: how the rollout worker runs the agent (an in-process callable here);
* ``rl_tasks`` / ``heldout``: the RL task stream and the held-out evaluation tasks, which share nothing;
* ``demonstrations`` / ``corpus``: the teacher's SFT conversations and the tokenizer's training text;
* ``gate_tasks`` / ``gate_success``: the warm start's competence check, on SFT-split tasks only;
* ``train_models``: the reward service's selector (``""``: every call trains; the SQL agent's checker is
  recorded as context but never trained);
* ``warm`` / ``gate`` and ``tiny_warm`` / ``tiny_gate``: the warm start's recipe and competence gate, and
  the smoke run's toy ones.

``calc`` is the calculator agent of ``examples/demo_agents/calc_agent`` (the demo's original, unchanged: same tasks,
same demonstrations, same cache keys). ``sql`` is the LangGraph SQL agent of ``examples/demo_agents/sql_agent``
(:mod:`examples.demo.sql_demo`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from examples.demo.sql_demo import SqlDemo
from examples.demo.warmconfig import GateConfig, WarmStartConfig, sample_replies
from examples.demo_agents.calc_agent import tasks as calc_tasks
from examples.demo_agents.calc_agent.agent import MAX_CALLS, MAX_TOKENS, first_messages, react
from schemas import AgentKind, AgentRef, Task

Conversation = list[dict[str, str]]


class DemoAgent(Protocol):
    """Read-only attributes (frozen dataclasses implement it) and the data hooks."""

    @property
    def name(self) -> str: ...
    @property
    def ref(self) -> AgentRef: ...
    @property
    def title(self) -> str: ...  # what the live display calls the agent
    @property
    def train_models(self) -> str: ...
    @property
    def fixed_models(self) -> tuple[str, ...]: ...  # roles served by a frozen copy of the warm start
    @property
    def eval_tasks(self) -> int: ...  # held-out tasks per evaluation when the command line says none
    @property
    def learning_rate(self) -> float: ...  # RL's, when the command line gives none
    @property
    def rl_seconds(self) -> float: ...  # RL's wall-clock seconds, when the command line gives none
    @property
    def warm(self) -> WarmStartConfig: ...
    @property
    def gate(self) -> GateConfig: ...
    @property
    def tiny_warm(self) -> WarmStartConfig: ...
    @property
    def tiny_gate(self) -> GateConfig: ...  # the smoke run's gate

    def rl_tasks(self, cfg: WarmStartConfig) -> Iterator[Task]: ...

    def heldout(self, cfg: WarmStartConfig, n: int) -> list[Task]: ...

    def demonstrations(self, cfg: WarmStartConfig) -> list[Conversation]: ...

    def corpus(self, cfg: WarmStartConfig) -> list[str]: ...

    def gate_tasks(self, cfg: WarmStartConfig, n: int) -> list[dict[str, Any]]: ...

    def gate_success(
        self, model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], seed: int
    ) -> float: ...


DEFAULT_WARM = WarmStartConfig()
CALC_REF = AgentRef(kind=AgentKind.callable, spec="examples.demo_agents.calc_agent.agent:run")
CALC_TINY = WarmStartConfig(hidden=64, layers=1, vocab_size=320, demos=40, sft_steps=4, sft_batch=4)
CALC_GATE = GateConfig()
CALC_TINY_GATE = GateConfig(  # fails: tops up once, re-initialises once, tops that up once
    min_success=0.5, tasks=4, max_attempts=2, reinit_below=0.0, top_up_steps=2, max_top_ups=1
)


@dataclass(frozen=True)
class CalcDemo:
    """The calculator agent: arithmetic problems, the teacher of ``examples/demo_agents/calc_agent/tasks.py``."""

    name: str = "calc"
    ref: AgentRef = CALC_REF
    title: str = "calculator agent"
    train_models: str = ""
    fixed_models: tuple[str, ...] = ()
    eval_tasks: int = 512
    learning_rate: float = 2e-4  # learns faster than 1e-4 (docs/results/tuning.md)
    rl_seconds: float = 420.0  # the RL run's 10 minutes less ~3 for the stack, two evaluations and a margin
    warm: WarmStartConfig = DEFAULT_WARM
    tiny_warm: WarmStartConfig = CALC_TINY
    gate: GateConfig = CALC_GATE
    tiny_gate: GateConfig = CALC_TINY_GATE

    def rl_tasks(self, cfg: WarmStartConfig) -> Iterator[Task]:
        for raw in calc_tasks.tasks("rl", cfg.seed):
            yield Task.model_validate(raw)

    def heldout(self, cfg: WarmStartConfig, n: int) -> list[Task]:
        return [Task.model_validate(t) for t in calc_tasks.sample("heldout", 10_000 + cfg.seed, n)]

    def demonstrations(self, cfg: WarmStartConfig) -> list[Conversation]:
        rng = random.Random(f"teacher-{cfg.seed}")
        return [
            calc_tasks.demonstration(
                task, rng, p_format=cfg.p_format, p_copy_expr=cfg.p_copy_expr, p_copy_answer=cfg.p_copy_answer
            )
            for task in calc_tasks.sample("sft", cfg.seed, cfg.demos)
        ]

    def corpus(self, cfg: WarmStartConfig) -> list[str]:
        return [m["content"] for d in self.demonstrations(cfg)[:1000] for m in d] + [
            "system",
            "user",
            "assistant",
        ]

    def gate_tasks(self, cfg: WarmStartConfig, n: int) -> list[dict[str, Any]]:
        return calc_tasks.sample("sft", 20_000 + cfg.seed, n)

    def gate_success(self, model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], seed: int) -> float:
        return calc_gate_success(model, tokenizer, tasks, seed)


CALC = CalcDemo()
NAMES = ("calc", "sql")


def demo_agent(name: str, cache: Path) -> DemoAgent:
    """The demo agent called ``name``; ``cache`` is where an agent keeps generated data (SQL databases)."""
    if name == "calc":
        return CALC
    if name == "sql":
        return SqlDemo(data_root=cache / "sql-data")
    raise ValueError(f"unknown demo agent {name!r} (one of {', '.join(NAMES)})")


def calc_gate_success(model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], seed: int) -> float:
    """The calculator agent's gate: the share of ``tasks`` the model solves through its protocol, sampled at
    temperature 1 as the agent does; batched ``generate`` in-process (a check, not the demo's metric,
    which always goes through the whole pipeline)."""
    torch.manual_seed(seed)
    convs = [first_messages(t["input"]["question"]) for t in tasks]
    answers: dict[int, str] = {}
    for _ in range(MAX_CALLS):
        live = [i for i in range(len(tasks)) if i not in answers]
        if not live:
            break
        replies = sample_replies(model, tokenizer, [convs[i] for i in live], MAX_TOKENS)
        for reply, i in zip(replies, live, strict=True):
            convs[i].append({"role": "assistant", "content": reply})
            kind, text = react(reply)
            if kind == "answer":
                answers[i] = text
            else:
                convs[i].append({"role": "user", "content": text})
    return sum(1 for i, t in enumerate(tasks) if answers.get(i) == t["answer"]) / len(tasks)
