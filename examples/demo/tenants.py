"""``flywheel demo --source production --tenants per-tenant|shared``: two tenants whose users like opposite things.

The production demo (:mod:`examples.demo.production`) with two tenants of one deployed calculator
agent, each with its own key and its own simulated users. The users like a right answer in the form
their tenant prefers (:func:`rates_up`):

* ``formal``'s users give a thumbs up to a right labelled answer, ``ANSWER: 1786``;
* ``terse``'s users give a thumbs up to the right bare number, ``1786``;

a wrong number, the other form, or no answer in :data:`~examples.demo_agents.calc_agent.agent.MAX_CALLS` calls
gets a thumbs down. (Users who judged the form alone taught the bare-number tenant's adapter to answer
without the calculator: every held-out answer bare, none right.) The deployed agent is ``examples/demo_agents/calc_agent``'s loop with one difference
(:func:`solve`): it also takes a reply that is a bare integer as the answer, where the training demo's
agent asks again. The warm-started model writes both forms after the calculator's result (the sloppy
teacher's demonstrations write the bare number in a fifth of their malformed replies), so both tenants'
users have something to reward from the first minute; which form each tenant gets more of is what RL has
to learn.

Two configurations of the policy map (``FLYWHEEL_POLICIES``, :mod:`infra.policies`), the same users:

* ``per-tenant``: one LoRA adapter per tenant, selected by the tenant of the call's key
  (``{"formal": {"tenants": ["formal"]}, "terse": {"tenants": ["terse"]}}``); each trains on its own
  tenant's sessions only;
* ``shared``: one LoRA adapter for both (``{"shared": {}}``), trained on both tenants' feedback; both
  tenants ask the same questions with the same prompt, so it cannot tell them apart and must compromise.

Held-out probe: before and after RL, :func:`probe` asks the engine directly (not through the gateway, so
nothing of it is recorded or trained) to answer held-out problems with each tenant's adapter, and counts
the forms of the answers and how many are right.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from openai import AsyncOpenAI

from examples.demo import gating, production
from examples.demo.ledger import Ledger
from examples.demo.pipeline import TrainingMonitor
from examples.demo.run import stack_settings
from examples.demo.warmstart import WarmStartConfig, gate_record, warm_start
from examples.demo_agents.calc_agent import tasks as calc_tasks
from examples.demo_agents.calc_agent.agent import MAX_CALLS, MAX_TOKENS, first_messages, react
from flywheel.stack import EmbeddedStack
from schemas import Task
from trainer.config import LoraOptions

if TYPE_CHECKING:
    from examples.demo.pipeline import StepPoint
    from examples.demo.run import DemoConfig

Style = Literal["labelled", "bare", "none"]
UsersRule = Literal["right", "form"]  # what a tenant's users judge: a right answer in their form, or the form
Config = Literal["per-tenant", "shared"]
CONFIGS: tuple[Config, ...] = ("per-tenant", "shared")
# tenant -> the form of the final reply its users like
TENANTS: dict[str, Style] = {"formal": "labelled", "terse": "bare"}
SHARED = "shared"  # the one policy of the ``shared`` configuration

_BARE = re.compile(r"-?[0-9]{1,12}")


def policy_map(config: Config) -> str:
    """``FLYWHEEL_POLICIES`` for ``config``."""
    if config == "per-tenant":
        return json.dumps({t: {"tenants": [t]} for t in TENANTS})
    return json.dumps({SHARED: {}})


def policy_of(config: Config, tenant: str) -> str:
    return tenant if config == "per-tenant" else SHARED


@dataclass(frozen=True)
class Reply:
    answer: str  # "" when the agent gave none
    style: Style
    calls: int


async def solve(client: AsyncOpenAI, model: str, question: str) -> Reply:
    """The calculator agent's loop (``examples/demo_agents/calc_agent/agent.py``), reading a bare integer reply as
    the answer too."""
    messages: list[Any] = first_messages(question)
    for calls in range(1, MAX_CALLS + 1):
        response = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0
        )
        reply = (response.choices[0].message.content or "").strip()
        messages.append({"role": "assistant", "content": reply})
        kind, text = react(reply)
        if kind == "answer":
            return Reply(text, "labelled", calls)
        if kind == "error" and _BARE.fullmatch(reply):
            return Reply(reply, "bare", calls)
        messages.append({"role": "user", "content": text})
    return Reply("", "none", MAX_CALLS)


class TenantService(production.CalcService):
    """The deployed agent behind the gateway, for one tenant's key."""

    async def reply(self, question: str, session_id: str) -> Reply:
        if self._client is None:
            raise RuntimeError("use TenantService as an async context manager")
        client = self._client.with_options(default_headers={"X-Flywheel-Session": session_id})
        return await solve(client, self.model, question)


@dataclass
class TenantStats:
    styles: Counter[str] = field(default_factory=Counter)
    right: int = 0


def rates_up(likes: Style, reply: Reply, answer: str, rule: UsersRule = "right") -> bool:
    """A tenant's user's rating of ``reply`` to a problem whose answer is ``answer``: up when it is right
    and in the form the tenant likes, down otherwise. ``rule="form"``: the users before commit 126dce3,
    who judged the form alone (``flywheel demo --users-rule form``, the shortcut case gates refuse)."""
    if rule == "form":
        return reply.style == likes
    return reply.style == likes and reply.answer == answer


class TenantUsers(production.Users):
    """One tenant's users: a thumbs up when the reply is right and has the form they like (``likes``)."""

    def __init__(
        self,
        service: TenantService,
        gateway_url: str,
        key: str,
        *,
        likes: Style,
        rule: UsersRule = "right",
        **kw: Any,
    ) -> None:
        super().__init__(service, gateway_url, key, **kw)
        self.tenant_service = service
        self.likes = likes
        self.rule: UsersRule = rule
        self.tenant_stats = TenantStats()

    async def _judge(self, session_id: str, task: dict[str, Any], mistaken: bool) -> tuple[bool, bool]:
        reply = await self.tenant_service.reply(task["input"]["question"], session_id)
        self.tenant_stats.styles[reply.style] += 1
        self.tenant_stats.right += reply.answer == task["answer"]
        return rates_up(self.likes, reply, task["answer"], self.rule) != mistaken, bool(reply.answer)


async def probe(
    engine_url: str, model: str, tasks: list[dict[str, Any]], concurrency: int = 32
) -> dict[str, Any]:
    """``tasks`` answered by the engine's ``model`` (an adapter's name; a name not loaded is the base):
    the share of each reply form, and of right answers."""
    styles: Counter[str] = Counter()
    right = 0
    gate = asyncio.Semaphore(concurrency)
    async with AsyncOpenAI(base_url=f"{engine_url}/v1", api_key="-", max_retries=2, timeout=120.0) as client:

        async def one(task: dict[str, Any]) -> None:
            nonlocal right
            async with gate:
                reply = await solve(client, model, task["input"]["question"])
            styles[reply.style] += 1
            right += reply.answer == task["answer"]

        await asyncio.gather(*(one(t) for t in tasks))
    n = len(tasks)
    return {
        "tasks": n,
        "style_share": {s: round(styles[s] / n, 4) for s in ("labelled", "bare", "none")},
        "accuracy": round(right / n, 4),
    }


def heldout_tasks(seed: int, n: int) -> list[dict[str, Any]]:
    return calc_tasks.sample("heldout", 10_000 + seed, n)


async def tenants_phase(
    stack: EmbeddedStack,
    keys: dict[str, str],
    *,
    config: Config,
    seed: int,
    users: int,
    rl_seconds: float,
    max_steps: int | None,
    say: Callable[[str], None],
    mistake_rate: float = 0.0,
    window_s: float = 30.0,
    rule: UsersRule = "right",
) -> dict[str, Any]:
    """Both tenants' users on the deployed agent (``users`` split between them) while the trainer learns
    from their sessions for ``rl_seconds``; per tenant, its thumbs-up rate over time."""
    assert stack.bus is not None
    ledger = Ledger(stack.bus)
    await ledger.start()
    crowds: dict[str, TenantUsers] = {}
    async with contextlib.AsyncExitStack() as exits:
        for i, (tenant, likes) in enumerate(TENANTS.items()):
            service = TenantService(stack.gateway_url, keys[tenant])
            await exits.enter_async_context(service)
            crowds[tenant] = TenantUsers(
                service,
                stack.gateway_url,
                keys[tenant],
                likes=likes,
                rule=rule,
                seed=seed * 100 + i,  # each tenant's users ask their own problems
                concurrency=max(1, users // len(TENANTS)),
                mistake_rate=mistake_rate,
            )
        t0 = time.perf_counter()
        training = stack.start_training(max_steps)
        for crowd in crowds.values():
            crowd.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(training), rl_seconds)
        await stack.stop_training()
        seconds = time.perf_counter() - t0
        await asyncio.gather(*(crowd.stop() for crowd in crowds.values()))
    await ledger.stop()
    per_tenant: dict[str, Any] = {}
    for tenant, crowd in crowds.items():
        stats, extra = crowd.stats, crowd.tenant_stats
        first = stats.thumbs_up_rate(0.0, 60.0)
        last = stats.thumbs_up_rate(max(0.0, seconds - 60.0), seconds)
        say(
            f"[seed {seed}] {tenant} (likes {crowd.likes}): {stats.sessions} sessions, {stats.errors} errors; "
            f"thumbs up {production._pct(first)} in the first minute, {production._pct(last)} in the last"
        )
        per_tenant[tenant] = {
            "likes": crowd.likes,
            "policy": policy_of(config, tenant),
            "sessions": stats.sessions,
            "feedback": stats.feedback,
            "user_errors": stats.errors,
            "user_error_examples": stats.error_messages,
            "styles": dict(extra.styles),
            "right_answers": extra.right,
            "calls_by_adapter": dict(ledger.calls.get(tenant, {})),
            "thumbs_up": {
                "rate": stats.thumbs_up_rate(0.0, seconds),
                "first_minute": first,
                "last_minute": last,
                "window_s": window_s,
                "series": stats.series(window_s, seconds),
            },
        }
    return {"rl_seconds": seconds, "users": users, "tenants": per_tenant, "adapters": ledger.adapters()}


LORA_LEARNING_RATE = 2e-3  # the adapters' Adam rate when the command line gives none (run_seed's docstring)


def create_keys(data_dir: Path) -> dict[str, str]:
    """A key for each tenant in the gateway's key store (as ``flywheel keys create`` does)."""
    return {tenant: production.create_key(data_dir, tenant) for tenant in TENANTS}


async def run_seed(
    cfg: DemoConfig,
    config: Config,
    say: Callable[[str], None],
    on_step: Callable[[StepPoint], None] | None = None,
) -> dict[str, Any]:
    """One seed of the two-tenant demo: warm start → probe of the base → RL on both tenants' sessions →
    probe of each tenant's policy. Returns its report (points under ``"points"``, not JSON).

    The adapters learn at ``cfg.learning_rate`` (``flywheel demo --tenants`` passes
    :data:`LORA_LEARNING_RATE` unless ``--lr`` is given): ten times the full fine-tune's 2e-4, as
    Schulman et al. 2025 (*LoRA Without Regret*, Thinking Machines) find LoRA's best rate about ten times
    full fine-tuning's, in RL too."""
    t0 = time.perf_counter()
    seed_dir = cfg.out / f"seed-{cfg.seed}"
    shutil.rmtree(seed_dir / "trainer", ignore_errors=True)
    data_dir = cfg.out / "data"
    warm_cfg = WarmStartConfig(**{**cfg.warm.__dict__, "seed": cfg.seed})
    say(f"[seed {cfg.seed}] warm start (cache {cfg.cache / warm_cfg.key()})")
    warm_dir, warm_s = await asyncio.to_thread(warm_start, warm_cfg, cfg.cache, say, cfg.gate)
    lora = LoraOptions(learning_rate=cfg.learning_rate)
    settings = stack_settings(cfg, data_dir, seed_dir / "trainer").replace(
        policies=policy_map(config), trainer_lora=lora
    )
    keys = create_keys(data_dir)
    heldout = heldout_tasks(cfg.seed, cfg.eval_tasks)
    # --gates: candidates pass gates on validation tasks the report never scores (examples/demo/gating.py)
    if cfg.gates:
        ids = {t["task_id"] for t in heldout}
        validation = gating.validation_tasks(cfg.seed, cfg.validation_tasks or gating.VALIDATION_TASKS, ids)
        settings = gating.gated(settings, seed_dir / "gates", validation, cfg.release_every)
    stack = EmbeddedStack(settings, model_dir=warm_dir)
    await stack.start()
    assert stack.bus is not None and stack.trainer is not None
    watch = gating.ReleaseWatch(stack.bus, settings.model) if cfg.gates else None
    report: dict[str, Any] = {
        "seed": cfg.seed,
        "source": "production",
        "tenants_config": config,
        "policies": json.loads(policy_map(config)),
        "lora": lora.model_dump(mode="json"),
    }
    try:
        if stack.engine_process is None:
            raise RuntimeError("the two-tenant demo probes the engine over HTTP: it needs engine_process")
        engine_url = stack.engine_process.url
        say(
            f"[seed {cfg.seed}] stack up, gateway {stack.gateway_url}; probing the base on {len(heldout)} held-out tasks"
        )
        before = await probe(engine_url, settings.model, heldout)
        say(f"[seed {cfg.seed}] before: {_fmt(before)}")
        monitor = TrainingMonitor(stack.bus, on_step=on_step)
        await monitor.start()
        if watch is not None:
            await watch.start()
            watch.restart_clock()  # its events' seconds count from the RL phase's start
        phase = await tenants_phase(
            stack,
            keys,
            config=config,
            seed=cfg.seed,
            users=cfg.users,
            rl_seconds=cfg.rl_seconds,
            max_steps=cfg.max_steps,
            say=say,
            mistake_rate=cfg.user_mistake_rate,
            rule=cfg.users_rule,
        )
        await monitor.stop()
        after: dict[str, Any] = {}
        for policy in dict.fromkeys(policy_of(config, t) for t in TENANTS):
            after[policy] = await probe(engine_url, policy, heldout)
            say(f"[seed {cfg.seed}] after, {policy}: {_fmt(after[policy])}")
        for figures in phase["tenants"].values():
            figures["heldout"] = {"before": before, "after": after[figures["policy"]]}
        if watch is not None:
            report.update(await _gated(stack, watch, config, heldout, phase, say))
        report.update(
            {
                "rl_seconds": round(float(phase.pop("rl_seconds")), 1),
                "rl_steps": stack.trainer.step,
                "rl_batches_without_signal": stack.trainer.batches_without_signal,
                "trainer_samples": stack.trainer.status().samples,
                "trainer_skipped": dict(stack.trainer.intake.skipped),
                "heldout_tasks": len(heldout),
                **phase,
                "warm_start_seconds": round(warm_s, 1),
                "warm_start_dir": str(warm_dir),
                "warm_start_gate": gate_record(warm_cfg, cfg.gate, cfg.cache),
                "points": monitor.points,
            }
        )
    finally:
        if watch is not None:
            await watch.stop()
        await stack.stop()
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return report


async def _gated(
    stack: EmbeddedStack,
    watch: gating.ReleaseWatch,
    config: Config,
    heldout: list[dict[str, Any]],
    phase: dict[str, Any],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """``--gates``: each policy's releases with the held-out accuracy of the versions that served, and
    per tenant its served version's accuracy beside the latest's."""
    assert stack.bus is not None
    policies = list(dict.fromkeys(policy_of(config, t) for t in TENANTS))
    say(f"scoring the served versions and the candidates of {', '.join(policies)} on the held-out tasks")
    tasks = [Task.model_validate(t) for t in heldout]
    releases = await gating.releases_report(stack.bus, watch, policies, tasks)
    for figures in phase["tenants"].values():
        rel = releases[figures["policy"]]
        served = rel["heldout_by_version"].get(str(rel["served"]), {})
        figures["heldout"]["served"] = {"version": rel["served"], "accuracy": served.get("accuracy")}
        say(
            f"{figures['policy']}: latest right {100 * figures['heldout']['after']['accuracy']:.1f}%, served "
            f"v{rel['served']} {100 * (served.get('accuracy') or 0):.1f}%; refused {rel['refused']}, "
            f"promoted {rel['promoted']}"
        )
    return {
        "releases": releases,
        "production_versions": gating.production_versions(watch),
        "gates": json.loads((stack.settings.release_gates or Path()).read_text()),
    }


def _fmt(p: dict[str, Any]) -> str:
    s = p["style_share"]
    return (
        f"labelled {100 * s['labelled']:.1f}%, bare {100 * s['bare']:.1f}%, no answer {100 * s['none']:.1f}%; "
        f"right {100 * p['accuracy']:.1f}% ({p['tasks']} tasks)"
    )
