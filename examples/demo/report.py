"""The demo's outputs: ``report.json`` and ``training.png`` (matplotlib, headless)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.demo.pipeline import StepPoint


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False))
    tmp.replace(path)


def _series(points: Sequence[StepPoint], name: str) -> tuple[list[int], list[float]]:
    xs = [p.step for p in points if name in p.metrics]
    return xs, [p.metrics[name] for p in points if name in p.metrics]


def _thumbs_up(ax: Any, run: dict[str, Any], points: Sequence[StepPoint]) -> None:
    """Production: the users' thumbs-up rate per window of seconds, and the trained batches' reward."""
    thumbs = run["thumbs_up"]
    series = thumbs["series"]
    ax.plot(
        [p["t"] for p in series],
        [p["rate"] for p in series],
        color="tab:green",
        marker=".",
        label=f"thumbs-up rate ({thumbs['window_s']:.0f} s windows)",
    )
    ax.plot(
        [p.elapsed_s for p in points if "reward" in p.metrics],
        [p.metrics["reward"] for p in points if "reward" in p.metrics],
        color="tab:blue",
        alpha=0.4,
        label="reward of the trained batch",
    )
    ax.set_title(f"seed {run['seed']}: production feedback over time")
    ax.set_xlabel("seconds of RL")
    ax.set_ylim(-0.05, 1.05)


def _replay_panel(ax: Any, run: dict[str, Any], points: Sequence[StepPoint]) -> None:
    """Replay: validation success at the checkpoints, and the per-step drift from μ and from the warm start."""
    checkpoints = run.get("checkpoints") or []
    ax.plot(
        [c["step"] for c in checkpoints],
        [c["success"] for c in checkpoints],
        color="tab:green",
        marker="o",
        label="validation success (checkpoints)",
    )
    chosen = run.get("chosen")
    if chosen:
        ax.scatter(
            [chosen["step"]],
            [chosen["success"]],
            s=120,
            facecolors="none",
            edgecolors="black",
            label="served",
        )
    xs, ys = _series(points, "advantage_positive")
    if ys:
        ax.plot(xs, ys, color="tab:gray", alpha=0.6, label="share of episodes with A > 0")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"seed {run['seed']}: replay, validation and drift")
    ax.set_xlabel("trainer step")
    ax.legend(loc="upper left", fontsize=7)
    # The KLs span orders of magnitude (a collapse shows as a jump of 10^3 or more): their own log axis,
    # so the validation curve keeps its 0-1 scale.
    drift = ax.twinx()
    for name, color, label in (
        ("reference_kl", "tab:purple", "KL from the warm start"),
        ("behaviour_kl", "tab:brown", "KL(μ ‖ π_old), recorded μ"),
    ):
        xs, ys = _series(points, name)
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
        if kept:
            drift.plot(*zip(*kept, strict=True), color=color, alpha=0.5, label=label)
    drift.set_yscale("log")
    drift.set_ylabel("KL (log)")
    drift.legend(loc="lower right", fontsize=7)


def plot(path: Path, runs: Sequence[dict[str, Any]]) -> None:
    """One row per seed: training reward, transitions/episode vs step; held-out bars before/after."""
    # lazy, and in this order: the Agg backend must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4 if any(r.get("source") == "replay" for r in runs) else 3
    fig, axes = plt.subplots(
        len(runs), columns, figsize=(14 + 4.5 * (columns - 3), 3.6 * len(runs)), squeeze=False
    )
    for row, run in zip(axes, runs, strict=True):
        if run.get("source") == "replay":
            _replay_panel(row[3], run, run["points"])
        elif columns > 3:
            row[3].axis("off")
        points: list[StepPoint] = run["points"]
        seed = run["seed"]
        if run.get("thumbs_up"):
            _thumbs_up(row[0], run, points)
        else:
            xs, reward = _series(points, "reward")
            row[0].plot(xs, reward, color="tab:blue", label="reward (train batch)")
            xs, success = _series(points, "success")
            if success:
                row[0].plot(xs, success, color="tab:green", alpha=0.6, label="success (train batch)")
            xs, tis = _series(points, "tis_mean")
            if run.get("source") == "replay" and tis:
                row[0].plot(xs, tis, color="tab:brown", alpha=0.6, label="mean TIS weight π_old/μ")
            row[0].set_title(f"seed {seed}: reward per step")
            row[0].set_xlabel("trainer step")
            row[0].set_ylim(-0.05, 1.05 if run.get("source") != "replay" else 2.05)
        row[0].legend(loc="lower right", fontsize=8)
        xs, calls = _series(points, "calls_per_episode")
        row[1].plot(xs, calls, color="tab:orange", label="transitions (LLM calls) / episode")
        xs, merged = _series(points, "transitions_per_episode")
        if merged:
            row[1].plot(xs, merged, color="tab:red", alpha=0.5, label="merged trajectories / episode")
        row[1].set_title(f"seed {seed}: transitions per episode")
        row[1].set_xlabel("trainer step")
        row[1].legend(loc="upper right", fontsize=8)
        labels, values, colors = [], [], []
        for key, label, color in (
            ("before", "warm start", "tab:gray"),
            ("after", "after RL", "tab:green"),
            ("sft_only_baseline", "SFT only\n(equal time)", "tab:purple"),
        ):
            if run.get(key):
                labels.append(label)
                values.append(100.0 * run[key]["success"])
                colors.append(color)
        bars = row[2].bar(labels, values, color=colors)
        for bar, value in zip(bars, values, strict=True):
            row[2].text(
                bar.get_x() + bar.get_width() / 2, value + 1, f"{value:.0f}%", ha="center", fontsize=9
            )
        row[2].set_ylim(0, 105)
        row[2].set_title(f"seed {seed}: held-out success (unseen tasks)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_tenants(path: Path, runs: Sequence[dict[str, Any]]) -> None:
    """The two-tenant demo: one row per seed, each tenant's thumbs-up rate over time and its held-out
    share of the answer form its users like, before and after RL."""
    # lazy, and in this order: the Agg backend must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.6 * len(runs)), squeeze=False)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for row, run in zip(axes, runs, strict=True):
        names, before, after = [], [], []
        for (tenant, t), color in zip(run["tenants"].items(), colors, strict=False):
            thumbs = t["thumbs_up"]
            row[0].plot(
                [p["t"] for p in thumbs["series"]],
                [p["rate"] for p in thumbs["series"]],
                color=color,
                marker=".",
                label=f"{tenant} (likes {t['likes']}), policy {t['policy']}",
            )
            names.append(tenant)
            before.append(100.0 * t["heldout"]["before"]["style_share"][t["likes"]])
            after.append(100.0 * t["heldout"]["after"]["style_share"][t["likes"]])
        row[0].set_title(
            f"seed {run['seed']} ({run['tenants_config']}): thumbs-up rate ({thumbs['window_s']:.0f} s windows)"
        )
        row[0].set_xlabel("seconds of RL")
        row[0].set_ylim(-0.05, 1.05)
        row[0].legend(loc="upper left", fontsize=8)
        xs = range(len(names))
        row[1].bar([x - 0.2 for x in xs], before, width=0.4, color="tab:gray", label="before RL (base)")
        row[1].bar([x + 0.2 for x in xs], after, width=0.4, color="tab:green", label="after RL")
        row[1].set_xticks(list(xs), names)
        row[1].set_ylim(0, 105)
        row[1].set_title("held-out: share of answers in the form the tenant likes (%)")
        row[1].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def calls_by_model(console: Any, run: dict[str, Any]) -> None:
    """A selective agent's calls per episode and model name: trained (transitions) vs context."""
    rows = [
        (key, (run.get(key) or {}).get("calls_by_model")) for key in ("before", "after", "sft_only_baseline")
    ]
    if not any(by_model for _, by_model in rows):
        return
    parts = []
    for key, by_model in rows:
        if by_model:
            cells = ", ".join(f"{m} {c['trained']:.2f}/{c['context']:.2f}" for m, c in by_model.items())
            parts.append(f"{key}: {cells}")
    console.print(f"seed {run['seed']}, calls per episode by model (trained/context): " + "; ".join(parts))


def updates_by_policy(console: Any, run: dict[str, Any]) -> None:
    """An agent with roles: each policy's updates, seconds per update and adapter bytes."""
    updates = run.get("updates_by_policy")
    if not updates:
        return
    parts = []
    for name, u in updates.items():
        per = u.get("seconds_per_update") or {}
        size = u["adapter_bytes"] if u.get("adapter_bytes") is not None else u.get("model_bytes")
        what = "adapter" if u.get("adapter_bytes") is not None else "model"
        parts.append(
            f"{name} {u['updates']} updates, {per.get('mean', 0.0):.2f} s/update, {what} {size or 0:,} bytes"
        )
    config = run.get("policies_config", "full")
    console.print(f"seed {run['seed']}, {config}: " + "; ".join(parts))
