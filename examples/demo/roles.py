"""``flywheel demo --agent sql --policies writer,rewriter|shared``: a LoRA adapter per role, or one shared.

An agent with roles (its ``train_models``, the SQL agent's ``writer`` and ``rewriter``; its fixed roles,
the ``checker``, are served by a frozen copy of the warm start) trains by default one policy, the whole
model fully fine-tuned, on every trained role's calls. ``--policies`` trains LoRA adapters over the warm
start instead, which stays frozen (the trainer's policy map, ``FLYWHEEL_POLICIES``, :mod:`infra.policies`):

* ``--policies writer,rewriter`` (``per-role``): one adapter per named role, each selected by the model
  name the role asks for and trained on that role's calls only, all from the same episodes; a trained role
  left out is served by the base and not trained;
* ``--policies shared``: one adapter for all trained roles' calls.

With no ``--policies`` the configuration is ``full`` (the fine-tune every other demo runs). The three are
what the demo's report compares: held-out execution accuracy and calls per episode before and after, and
per policy (:class:`~examples.demo.ledger.Ledger`) its updates, adapter bytes and seconds per update.
The held-out evaluations go through the gateway as training does, so each role's calls are served by
that role's adapter (``EvalResult.adapters_by_model`` records which).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from examples.demo.agents import DemoAgent
from examples.demo.ledger import Ledger
from flywheel.stack_settings import StackSettings
from infra.policies import PolicyMap
from trainer.config import LoraOptions

Config = Literal["full", "per-role", "shared"]
SHARED: Final = "shared"  # ``--policies shared``, and the one adapter's name then


class RolePoliciesError(ValueError):
    """``--policies`` does not fit the agent (the message is the command line's one-line error)."""


@dataclass(frozen=True)
class RolePolicies:
    config: Config  # "per-role" or "shared"
    roles: tuple[str, ...]  # the roles with an adapter (per-role) or sharing it (shared)

    def policy_of(self, role: str) -> str | None:
        """The adapter serving ``role``'s calls (None: the base)."""
        if role not in self.roles:
            return None
        return SHARED if self.config == SHARED else role

    @property
    def policies(self) -> dict[str, dict[str, list[str]]]:
        """The policy map, policy → selectors: each adapter selected by its roles' model names."""
        if self.config == SHARED:
            return {SHARED: {"models": list(self.roles)}}
        return {role: {"models": [role]} for role in self.roles}

    def policy_map(self) -> str:
        """``FLYWHEEL_POLICIES`` (JSON)."""
        text = json.dumps(self.policies)
        PolicyMap.parse(text)  # the map the gateway and the trainer read
        return text


def trained_roles(agent: DemoAgent) -> tuple[str, ...]:
    return tuple(r.strip() for r in agent.train_models.split(",") if r.strip())


def role_policies(agent: DemoAgent, spec: str) -> RolePolicies:
    """``--policies`` (``writer,rewriter``, a subset of the agent's trained roles, or ``shared``) for
    ``agent``; raises :class:`RolePoliciesError` with a one-line message."""
    roles = trained_roles(agent)
    if not roles:
        raise RolePoliciesError(
            f"--policies trains an adapter per role of an agent with roles (--agent sql); the {agent.name} "
            "agent has one role"
        )
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise RolePoliciesError(f"--policies names roles ({', '.join(roles)}) or is 'shared'")
    if names == [SHARED]:
        return RolePolicies(SHARED, roles)
    for name in names:
        if name == SHARED:
            raise RolePoliciesError("--policies shared is one adapter for every role: name no role with it")
        if name in agent.fixed_models:
            raise RolePoliciesError(
                f"--policies: {name!r} is a fixed role of the {agent.name} agent (served by the frozen warm "
                f"start, never trained); trained roles: {', '.join(roles)}"
            )
        if name not in roles:
            raise RolePoliciesError(
                f"--policies: unknown role {name!r} of the {agent.name} agent (its trained roles: "
                f"{', '.join(roles)}; or 'shared')"
            )
    if len(set(names)) != len(names):
        raise RolePoliciesError(f"--policies names a role twice: {spec}")
    return RolePolicies("per-role", tuple(names))


def with_adapters(
    settings: StackSettings, roles: RolePolicies, learning_rate: float
) -> tuple[StackSettings, dict[str, Any]]:
    """The stack's settings with the policy map and the adapters' options (the default shape, at
    ``learning_rate``), and those options as the report writes them."""
    options = LoraOptions(learning_rate=learning_rate)
    adapters = settings.replace(policies=roles.policy_map(), trainer_lora=options)
    return adapters, options.model_dump(mode="json")


def config_of(roles: RolePolicies | None) -> Config:
    return "full" if roles is None else roles.config


def report_fields(roles: RolePolicies | None, lora: dict[str, Any] | None) -> dict[str, Any]:
    """The report's description of the configuration (written before the run)."""
    out: dict[str, Any] = {"policies_config": config_of(roles)}
    if roles is not None:
        out["policies"] = roles.policies
        out["lora"] = lora
    return out


def update_figures(ledger: Ledger, roles: RolePolicies | None, warm_dir: Path) -> dict[str, Any]:
    """After RL: per policy, its updates (count, last version, adapter bytes, seconds per update); for the
    full fine-tune also the bytes of the whole model each update replaces; with adapters, each role's
    calls during RL by the adapter that served them."""
    updates = ledger.adapters()
    out: dict[str, Any] = {"updates_by_policy": updates}
    if roles is None:
        weights = warm_dir / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else None
        for entry in updates.values():
            entry["model_bytes"] = size
    else:
        out["calls_by_adapter"] = {role: dict(c) for role, c in sorted(ledger.calls.items())}
    return out
