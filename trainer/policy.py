"""What the trainer trains: a policy of the policy map, and a GRPO group's split by policy.

A :class:`Policy` is one set of trained weights with everything that follows them: its backend (the
step, the version counter, the Adam state), its weight-update protocol and sinks, its checkpoints, its
production baselines. The trainer (:class:`trainer.service.TrainerService`) holds a map of them:

    the whole model     one policy, ``adapter`` None: every weight trains; its checkpoints are the
                        trainer's own (``<trainer_root>/checkpoints``, beside the loop's state)
    FLYWHEEL_POLICIES   one LoRA adapter per policy over the frozen base (trainer/lora.py), each with its
                        checkpoints under ``<trainer_root>/policies/<name>``, the same layout

A group is split by policy (:func:`split_by_policy`) only when the map holds adapters: the whole model
takes every group as it is.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas import EpisodeScored, StepMetrics
from trainer.backends.base import Backend
from trainer.baselines import ProductionBaselines
from trainer.checkpoints import CheckpointStore
from trainer.groups import Group
from trainer.weights import WeightSync


@dataclass
class Policy:
    """One trained set of weights (see the module docstring); ``weights.adapter`` names its adapter."""

    name: str
    backend: Backend
    weights: WeightSync
    store: CheckpointStore
    baselines: ProductionBaselines = field(default_factory=ProductionBaselines)
    samples: Counter[str] = field(default_factory=Counter)  # trained per episode source, kept across restarts
    metrics: StepMetrics = field(default_factory=StepMetrics)  # its last step's

    @property
    def adapter(self) -> str | None:
        return self.weights.adapter

    @property
    def exports(self) -> bool:
        """Whether an update writes the weights out: for a sink that loads a file, and always for an
        adapter (a few MB, and its size is a figure of the step)."""
        return self.adapter is not None or self.weights.needs_path

    def export(self) -> Path:
        """The weights as a directory a server loads, under ``<store>/exports``; keeps the last three."""
        return export_keeping_three(self.backend.export_weights, self.backend.version, self.store.root)


def export_keeping_three(export: Callable[[Path], Path], version: int, root: Path) -> Path:
    """``export`` version ``version`` under ``root/exports`` (a directory a server loads); keeps three."""
    exports = root / "exports"
    path = export(exports / f"v{version:06d}")
    for old in sorted(p for p in exports.iterdir() if p.is_dir())[:-3]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def split_by_policy(groups: Sequence[Group], names: Sequence[str]) -> tuple[dict[str, list[Group]], int]:
    """Per policy, its sub-groups; and how many transitions are of no known policy (not trained: the
    base is frozen).

    A policy's sub-group holds the members that have transitions of that policy (``Transition.policy``,
    set from the call's adapter by the reward service), with only those transitions, plus the members
    without any transition (their reward is baseline, as always); members whose transitions are all
    another policy's are not in it: a GRPO group never mixes policies.
    """
    known = set(names)
    out: dict[str, list[Group]] = {}
    unmatched = 0
    for group in groups:
        per: dict[str, dict[str, EpisodeScored]] = {}
        bare: dict[str, EpisodeScored] = {}
        for eid, episode in group.members.items():
            if not episode.transitions:
                bare[eid] = episode
                continue
            by: dict[str, list[Any]] = {}
            for t in episode.transitions:
                if t.policy is None or t.policy not in known:
                    unmatched += 1
                else:
                    by.setdefault(t.policy, []).append(t)
            for policy, ts in by.items():
                per.setdefault(policy, {})[eid] = episode.model_copy(update={"transitions": ts})
        for policy, members in per.items():
            sub = Group(
                group.group_id, group.group_size, group.first_seen, {**members, **bare}, group.expired
            )
            out.setdefault(policy, []).append(sub)
    return out, unmatched
