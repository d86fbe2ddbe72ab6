"""The demo's targets, and a grader for the report a ``flywheel demo`` run writes.

The product reports what a run measured; what a run must reach lives here, with the check:

* RL from rollouts: each demo agent's own held-out gain (calc +25 points, sql +20, on held-out
  databases), with fewer transitions per episode (the policy stops needing the agent's retries);
* production traffic alone raises held-out success by 15 points;
* a replayed run alone (``--source replay --from`` the same seed's recorded run) raises it by 15 points;
* every source within 10 minutes of RL run (evaluations and RL from the warm start).

    python tests/benchmarks/demo_targets.py OUT/report.json [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RL_RUN_SECONDS = 600.0
ROLLOUT_POINTS = {"calc": 25.0, "sql": 20.0}  # by demo agent
SOURCE_POINTS = {"production": 15.0, "replay": 15.0}


def target_points(source: str, agent: str) -> float:
    """The held-out gain (points) the target asks of ``source`` for the demo agent named ``agent``."""
    return ROLLOUT_POINTS[agent] if source == "rollouts" else SOURCE_POINTS[source]


def met_target(
    source: str,
    agent: str,
    before: tuple[float, float],
    after: tuple[float, float],
    rl_run_seconds: float,
) -> bool:
    """``before`` and ``after``: (held-out success, transitions per episode)."""
    points = 100.0 * (after[0] - before[0])
    if rl_run_seconds > RL_RUN_SECONDS:
        return False
    if source == "rollouts":
        return points >= target_points(source, agent) and after[1] < before[1]
    return points >= target_points(source, agent)


def grade(run: dict[str, Any]) -> bool:
    """One seed's ``report.json`` (``flywheel demo --out``'s ``seed-N/report.json``, or a one-seed top level)."""

    def pair(key: str) -> tuple[float, float]:
        return float(run[key]["success"]), float(run[key]["transitions_per_episode"])

    agent = str(run.get("agent", "calc"))
    return met_target(
        str(run.get("source", "rollouts")), agent, pair("before"), pair("after"), float(run["rl_run_seconds"])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    runs = report.get("per_seed") or [report]
    met = {f"seed_{r['seed']}_met": grade(r) for r in runs}
    first = runs[0]
    goal = target_points(str(first.get("source", "rollouts")), str(first.get("agent", "calc")))
    if args.json:
        print(
            json.dumps({"figures": met, "goals": {"success_points": goal, "rl_run_seconds": RL_RUN_SECONDS}})
        )
    else:
        for key, ok in met.items():
            print(f"{key}: {'met' if ok else 'not met'}")
    sys.exit(0 if all(met.values()) else 1)


if __name__ == "__main__":
    main()
