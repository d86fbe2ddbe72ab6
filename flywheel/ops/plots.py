"""``flywheel stats --plot``: the training curves in one PNG (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.eventlog.models import StatsPoint


def plot_stats(points: Sequence[StatsPoint], path: Path) -> None:
    """Four panels over time: mean reward, success rate, calls and transitions per episode, and the
    policy versions that generated the data (mean and max per bucket: their gap is the spread of
    staleness within a bucket)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [p.bucket for p in points]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    ax = axes[0][0]
    ax.plot(x, [p.mean_reward for p in points], marker="o")
    ax.set_title("mean reward")
    ax = axes[0][1]
    ax.plot(x, [p.success_rate for p in points], marker="o", color="tab:green", label="success")
    if any(p.production_sessions for p in points):  # production traffic: how users answered, over time
        ax.plot(x, [p.feedback_rate for p in points], marker="s", label="production feedback rate")
        ax.plot(x, [p.thumbs_up_rate for p in points], marker="^", label="thumbs-up rate")
        ax.legend()
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("success rate")
    ax = axes[1][0]
    ax.plot(x, [p.mean_calls for p in points], marker="o", label="calls / episode")
    ax.plot(x, [p.mean_transitions for p in points], marker="s", label="transitions / episode")
    ax.legend()
    ax.set_title("episode length")
    ax = axes[1][1]
    ax.plot(x, [p.mean_weight_version for p in points], marker="o", label="mean")
    ax.plot(x, [p.max_weight_version for p in points], marker="^", label="max")
    ax.legend()
    ax.set_title("weight version of the data")
    for row in axes:
        for a in row:
            a.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.suptitle(f"Flywheel: {sum(p.episodes for p in points)} scored episodes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
