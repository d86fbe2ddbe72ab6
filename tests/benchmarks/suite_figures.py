"""Figures of two test suites that measure while they check, printed as a benchmark's ``--json``.

The fault suite (``tests/faults``) and the framework-agents test (``tests/e2e/test_framework_agents.py``)
each assert their properties and print what they measured along the way. This runs the suite with
pytest as CI does and turns those lines into one ``{"figures": {...}, "goals": {...}}`` object, so
``tests/benchmarks/results_page.py --add-run`` takes it as it came:

- ``faults``: every test's ``Figures`` (``tests/faults/procs.py``, one JSON object a line in
  ``FLYWHEEL_FAULT_FIGURES``, pointed at a fresh file here) as ``<test>_<figure>``; the goals are the
  suite's own assertions: no call lost, none recorded twice, no 5xx. The Kafka-marked tests need a
  broker (``FLYWHEEL_KAFKA_BOOTSTRAP``; without one pytest skips them, and ``tests_skipped`` says so).
- ``framework-agents``: the ``FRAMEWORK-MERGE`` line of each framework and mode (one episode of
  canonical tool JSON, one of compact) as ``<framework>_<canonical|compact>_<mode>_<stat>``: the
  trajectories an episode's three calls assembled into and the tokens they hold, with prompts
  rendered from the messages (``rendered``) and with tokens-in (``tokens_in``, the default); and
  ``<framework>_compact_rendered_over_tokens_in``, the tokens a compact-JSON episode costs without
  tokens-in over with it.

Both add ``tests_passed`` / ``tests_failed`` / ``tests_skipped`` from pytest's summary.

    python tests/benchmarks/suite_figures.py faults [--json]
    python tests/benchmarks/suite_figures.py framework-agents [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITES = {"faults": "tests/faults", "framework-agents": "tests/e2e/test_framework_agents.py"}
FAULT_GOALS = ("lost", "duplicates", "server_errors")  # each test's, "= 0"
MERGE = re.compile(r"^FRAMEWORK-MERGE (\S+) (\S+) (\S+) (\[.*\])$", re.MULTILINE)
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")


def run_pytest(path: str, env: dict[str, str]) -> str:
    """pytest's whole output (``-s``: the tests' own lines too); pytest's exit status is a figure."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "-rs", path]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


def outcome(output: str) -> dict[str, float]:
    """passed / failed / skipped from pytest's last summary line."""
    last = [line for line in output.splitlines() if SUMMARY.search(line)][-1:] or [""]
    counts = {kind.rstrip("s").replace("error", "failed"): int(n) for n, kind in SUMMARY.findall(last[0])}
    return {f"tests_{k}": float(counts.get(k, 0)) for k in ("passed", "failed", "skipped")}


def fault_figures(lines: list[str]) -> tuple[dict[str, object], dict[str, str]]:
    figures: dict[str, object] = {}
    goals: dict[str, str] = {}
    for line in lines:
        raw = json.loads(line)
        test = raw.pop("test")
        extra = raw.pop("extra", {}) or {}
        for key, value in {**raw, **extra}.items():
            if value is not None:
                figures[f"{test}_{key}"] = value
        goals.update({f"{test}_{key}": "= 0" for key in FAULT_GOALS})
    return figures, goals


def merge_figures(output: str) -> dict[str, object]:
    """Each ``FRAMEWORK-MERGE`` line's episodes, named by the tool JSON the model wrote."""
    figures: dict[str, object] = {}
    for framework, _endpoint, mode, table in MERGE.findall(output):
        for stats in json.loads(table):
            name = f"{framework}_{stats['json']}_{mode.replace('-', '_')}"
            figures[f"{name}_transitions"] = stats["transitions"]
            figures[f"{name}_training_tokens"] = stats["training_tokens"]
    for framework in dict.fromkeys(re.sub(r"_(canonical|compact)_.*", "", k) for k in figures):
        over = figures.get(f"{framework}_compact_rendered_training_tokens")
        under = figures.get(f"{framework}_compact_tokens_in_training_tokens")
        if isinstance(over, int) and isinstance(under, int) and under:
            figures[f"{framework}_compact_rendered_over_tokens_in"] = round(over / under, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="suite-figures-") as tmp:
        lines_file = Path(tmp) / "fault-figures.jsonl"
        env["FLYWHEEL_FAULT_FIGURES"] = str(lines_file)
        output = run_pytest(SUITES[args.suite], env)
        lines = lines_file.read_text().splitlines() if lines_file.exists() else []
    if args.suite == "faults":
        figures, goals = fault_figures(lines)
    else:
        figures, goals = merge_figures(output), {}
    figures.update(outcome(output))
    goals["tests_failed"] = "= 0"
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
    else:
        for key, value in figures.items():
            print(f"{key:<56} {value!s:>10}  {goals.get(key, '')}")
    if figures["tests_failed"]:
        print(output[-4000:], file=sys.stderr)


if __name__ == "__main__":
    main()
