"""The replay figures of docs/replay.md, read from the reports that produced them.

    python tests/benchmarks/replay_figures.py REPLAY_OUT [REPLAY_OUT ...] [--every N]

For each ``flywheel demo --source replay --out REPLAY_OUT`` directory: the held-out result beside the
recorded on-policy run's, the validation checkpoints, what was dropped as stale, and a per-step table
(every N-th step): the trainer's version, the recorded versions it trained on, staleness, the advantages,
the truncated importance weights, KL(μ ‖ π_old) against the recorded behaviour logprobs, the KL from the
warm start, the sampled tokens' NLL and the calls per episode. Markdown, so the page is pasted from it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("version", "version", "{:.0f}"),
    ("behaviour_version_min", "rec. min", "{:.0f}"),
    ("behaviour_version_mean", "rec. mean", "{:.1f}"),
    ("behaviour_version_max", "rec. max", "{:.0f}"),
    ("staleness_max", "lag max", "{:.0f}"),
    ("transitions", "trained", "{:.0f}"),
    ("advantage_abs_mean", "mean abs(A)", "{:.2f}"),
    ("advantage_positive", "A > 0", "{:.2f}"),
    ("tis_mean", "TIS", "{:.3f}"),
    ("behaviour_kl", "KL(μ‖π_old)", "{:.4f}"),
    ("reference_kl", "KL(warm)", "{:.4f}"),
    ("nll", "NLL", "{:.3f}"),
    ("calls_per_episode", "calls/ep", "{:.2f}"),
)


def _cell(step: dict[str, Any], key: str, fmt: str) -> str:
    return fmt.format(step[key]) if key in step else "–"


def figures(out: Path, every: int) -> str:
    # each seed's own report: the top level of a one-seed run leaves the steps out
    runs = [json.loads(path.read_text()) for path in sorted(out.glob("seed-*/report.json"))]
    lines: list[str] = []
    for run in runs:
        on = run["on_policy"]
        replay = run["replay"]
        lines.append(
            f"### seed {run['seed']}: {out} (order {replay.get('order', 'recorded')})\n\n"
            f"- recorded on-policy run: {100 * on['before']['success']:.1f}% → {100 * on['after']['success']:.1f}% "
            f"({on['delta']['success_points']:+.1f} points, {on['rl_steps']} steps in {on['rl_seconds']:.0f} s)\n"
            f"- replay: {100 * run['before']['success']:.1f}% → {100 * run['after']['success']:.1f}% "
            f"(**{run['delta']['success_points']:+.1f} points**), calls/episode "
            f"{run['before']['calls_per_episode']:.2f} → {run['after']['calls_per_episode']:.2f}; "
            f"{run['rl_steps']} steps, {run['rl_seconds']:.0f} s (validation included)\n"
            f"- groups: {replay['groups']} ({replay.get('signal_groups', '?')} with signal, "
            f"{replay['flat_groups']} flat), sent {replay['sent']} episodes; batches without signal "
            f"{run.get('rl_batches_without_signal')}; stale transitions dropped {run['stale']['stale_transition']} "
            f"({100 * run['stale']['share_of_sent_transitions']:.1f}% of those sent)\n"
            "- validation checkpoints (step: success): "
            + ", ".join(f"{c['step']}: {100 * c['success']:.1f}%" for c in run.get("checkpoints", []))
            + (f"; served step {run['chosen']['step']}" if run.get("chosen") else "")
            + "\n"
        )
        steps = run.get("steps", [])
        lines.append("| step | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
        lines.append("|---" * (len(COLUMNS) + 1) + "|")
        for i, step in enumerate(steps):
            if i % every and i != len(steps) - 1:
                continue
            cells = [_cell(step, key, fmt) for key, _, fmt in COLUMNS]
            lines.append(f"| {step['step']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", type=Path, nargs="+")
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    for out in args.outs:
        print(figures(out, args.every))


if __name__ == "__main__":
    main()
