"""Prompt-optimisation acceptance: ``flywheel optimize`` repairs a deliberately poor system prompt.

The calculator agent (examples/demo_agents/calc_agent, unchanged) runs on the demo's warm-started model
(examples/demo/warmstart.py, cached under ~/.cache/flywheel/demo: built on first use, ~7 minutes on a quiet
2-core machine), starting from a system prompt that never mentions the agent's ``CALC:``/``ANSWER:``
protocol. ``flywheel optimize`` runs as a user runs it, every evaluation a real rollout through worker,
gateway, engine and reward service. The reflection model is ``ScriptedReflectionLM`` (a fixed list of
proposals, tests/fakes/scripted_reflection.py): no capable LLM runs on this machine. Its list holds what
a reflection model reading the feedback might propose: a wrong fix first, then the protocol as the
agent's own error message states it. GEPA has to find out which one works, on real rollouts.

Figures: held-out success of the seed and of the winner (tasks of the held-out split, never seen by
GEPA), the gain in points, the whole command's wall-clock seconds, candidates and episodes.

    flock /tmp/flywheel-cpu.lock python tests/benchmarks/optimize.py [--json] [--heldout 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from examples.demo.warmstart import DEFAULT_CACHE, GateConfig, WarmStartConfig, warm_start  # noqa: E402
from examples.demo_agents.calc_agent import tasks as calc  # noqa: E402
from flywheel.optimize.tasks import write_tasks  # noqa: E402
from tests.fakes.scripted_reflection import ScriptedReflectionLM  # noqa: E402

POOR = "You are a helpful assistant. Answer the user's question."
PROPOSALS = [
    "You are a careful calculator. Reply with only the final number.",
    "Use CALC: <expr> then ANSWER: <n>.",
]
GOALS = {"success_points": "≥ 15", "seconds": "≤ 300"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=3.0, help="GEPA's time budget")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    say = (lambda m: None) if args.json else print
    model_dir, _ = warm_start(WarmStartConfig(seed=args.seed), DEFAULT_CACHE, say, GateConfig())
    with tempfile.TemporaryDirectory() as tmp, ScriptedReflectionLM(PROPOSALS) as lm:
        d = Path(tmp)
        write_tasks(d / "tasks.jsonl", calc.sample("rl", 40_000 + args.seed, 40))
        write_tasks(d / "heldout.jsonl", calc.sample("heldout", 50_000 + args.seed, args.heldout))
        (d / "seed.txt").write_text(POOR)
        env = {**os.environ, "FLYWHEEL_ENV": "development"}
        env.pop("FLYWHEEL_BUS", None)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                *(
                    sys.executable,
                    "-m",
                    "flywheel.cli.main",
                    "optimize",
                    "--model-dir",
                    str(model_dir),
                ),
                *("--tasks", str(d / "tasks.jsonl"), "--test-tasks", str(d / "heldout.jsonl")),
                *("--train", "16", "--val", "24", "--minibatch", "4", "--max-metric-calls", "150"),
                *("--minutes", str(args.minutes), "--seed", str(args.seed)),
                *("--reflection-url", lm.url, "--reflection-model", "scripted-reflection"),
                *("--seed-prompt", str(d / "seed.txt"), "--out", str(d / "out")),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"flywheel optimize failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        report = json.loads((d / "out" / "report.json").read_text())
    held = report["held_out"]
    figures = {
        "seed_success": held["seed"]["success"],
        "best_success": held["best"]["success"],
        "success_points": held["success_points"],
        "seconds": round(seconds, 1),
        "gepa_seconds": report["gepa_seconds"],
        "candidates": len(report["candidates"]),
        "episodes": report["episodes"]["all"],
        "heldout_tasks": held["best"]["episodes"],
        "best_prompt": report["best"]["text"],
    }
    if args.json:
        print(json.dumps({"figures": figures, "goals": GOALS}))
        return
    print(f"{'figure':<16} {'value':>12}  goal")
    for key, value in figures.items():
        print(f"{key:<16} {value!s:>12}  {GOALS.get(key, '')}")


if __name__ == "__main__":
    main()
