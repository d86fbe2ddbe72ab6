"""SFT mode with a policy map: each adapter takes cross-entropy steps on its own role's good transitions.

``FLYWHEEL_POLICIES=writer,rewriter`` with ``FLYWHEEL_TRAINER_OBJECTIVE=sft`` on the embedded stack: the
trainer splits each group by policy, keeps the episodes whose reward reaches ``sft_reward_threshold``
(``trainer.sft.select_episodes``), and trains each adapter on its own role's transitions of those
episodes (an SFT step: ``sft_loss``, no advantages), loading each new version into the engine; the base
stays frozen. Afterwards each adapter gives its role's chosen replies more probability than the base does.
"""

from __future__ import annotations

import asyncio
from itertools import repeat
from pathlib import Path

import pytest
import torch

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.base import Message
from schemas import CONTROL, TRANSITIONS, AgentKind, AgentRef, EpisodeScored, Task
from schemas.control import TrainerStepCompleted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

AGENT = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.two_roles_agent:run")
ROLES = ("writer", "rewriter")


async def test_sft_mode_trains_each_adapter_on_its_roles_good_transitions(tmp_path: Path) -> None:
    from flywheel.cli.ops_up import TINY_CACHE, TINY_CORPUS
    from trainer.config import LoraOptions
    from trainer.models.tiny import build_tiny
    from trainer.policy_service import PolicyTrainerService

    model = await asyncio.to_thread(build_tiny, TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)
    settings = StackSettings(
        data_dir=tmp_path,
        record_events=False,
        gateway_port=0,
        policies=",".join(ROLES),
        trainer_objective="sft",
        trainer_mode="sync",
        trainer_batch_groups=2,
        trainer_torch_threads=1,
        trainer_lora=LoraOptions(learning_rate=1e-2),
    )
    scored: list[EpisodeScored] = []
    steps: list[TrainerStepCompleted] = []

    async def on_event(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
        elif isinstance(msg.event, TrainerStepCompleted):
            steps.append(msg.event)

    task = Task(task_id="two-roles", input={"question": "What is 2 plus 3?"})
    stack = EmbeddedStack(settings, model_dir=model, tasks=repeat(task), agent=AGENT, group_size=4)
    async with stack:
        assert stack.bus is not None and isinstance(stack.trainer, PolicyTrainerService)
        assert stack.engine is not None
        subs = [
            await stack.bus.subscribe(t, "policies-sft-test", on_event, from_beginning=True)
            for t in (TRANSITIONS, CONTROL)
        ]
        await asyncio.wait_for(stack.start_training(1), 150)
        for sub in subs:
            await sub.stop()
        status = stack.trainer.status()
        served = stack.engine.adapters
        base_version = stack.engine.weight_version
        policies = stack.trainer.policies
        trained = {e.adapter for e in steps}

        good = [s for s in scored if (s.reward or 0.0) >= 1.0]
        assert good, [s.reward for s in scored]

        def reply_logprob(role: str, adapter_on: bool) -> float:
            """Σ log p of the role's replies in the good episodes, under its adapter or the base."""
            total = 0.0
            for s in good:
                for t in s.transitions:
                    if t.policy != role:
                        continue
                    ids = torch.tensor([list(t.prompt_ids) + list(t.response_ids)])
                    with torch.no_grad():
                        if adapter_on:
                            policies.model.set_adapter(role)
                            logits = policies.model(ids).logits[0]
                        else:
                            with policies.model.disable_adapter():
                                logits = policies.model(ids).logits[0]
                    logp = torch.log_softmax(logits.float(), -1)
                    n = len(t.prompt_ids)
                    for i, (tok, generated) in enumerate(zip(t.response_ids, t.response_mask, strict=True)):
                        if generated:  # the tokens SFT trains on (observation tokens are masked)
                            total += float(logp[n + i - 1, tok])
            return total

        lifted = {
            role: (await asyncio.to_thread(reply_logprob, role, True))
            - (await asyncio.to_thread(reply_logprob, role, False))
            for role in ROLES
        }
    print(f"SFT adapters: {status.adapters}, log-likelihood of the chosen replies over the base: {lifted}")
    assert status.adapters == {"writer": 1, "rewriter": 1} == status.serving_adapters, status
    assert served == {"writer": 1, "rewriter": 1} and base_version == 0
    assert trained == set(ROLES)
    for e in steps:  # an SFT step: its cross-entropy, not the policy loss
        assert e.metrics.get("sft_loss") is not None and e.metrics.get("loss") is None, e.metrics
        assert (e.metrics.get("success") or 0.0) > 0 and (e.metrics.get("transitions") or 0) > 0
    for role in ROLES:
        assert lifted[role] > 0, lifted  # the step moved each adapter toward its role's chosen replies
