"""The documentation holds: links resolve, generated pages are current, nothing points outside the repo.

- every relative link (and its ``#anchor``) in ``README.md``, ``docs/**/*.md`` and the package READMEs
  names a file or folder that exists, and an anchor a heading of that page (GitHub's slugs);
- every test those pages cite as proof exists;
- ``docs/configuration.md`` is what ``python -m flywheel.config_reference`` renders from the settings
  models, and every setting has a meaning;
- ``docs/results.md`` and the README's headline table are what ``tests/benchmarks/results_page.py``
  renders from ``docs/results/*.json``;
- no file of the repository cites the design notes that live outside it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flywheel import config_reference

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")
_CODE = re.compile(r"`+[^`]*`+")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in sorted(p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if folder.name in ("docs", "tests"):
            continue
        files += sorted(folder.rglob("README.md"))
    return files


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in [*_LINK.findall(line), *_IMAGE.findall(line)]:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: — not checked here
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading with that anchor)")
    return problems


def test_the_slugs_are_githubs() -> None:
    assert slug("The SQL demo (`--agent sql`)") == "the-sql-demo---agent-sql"
    assert (
        slug("Prompt optimisation (no change to the agent)") == "prompt-optimisation-no-change-to-the-agent"
    )
    assert slug("Framework agents: tokens per episode") == "framework-agents-tokens-per-episode"


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "index.md").write_text("# Index\n\n## A heading\n")
    probe = tmp_path / "probe.md"
    probe.write_text(
        "# Probe\n\n[a](index.md#no-such-heading) [b](missing.md) [c](#probe) [d](index.md#a-heading)"
        " `[e](nowhere.md)`\n\n```\n[f](nowhere.md)\n```\n"
    )
    problems = broken_links(probe)
    assert len(problems) == 2, problems
    assert "no heading" in problems[0] and "no such file" in problems[1]


def test_every_relative_link_and_anchor_resolves() -> None:
    files = markdown_files()
    assert ROOT / "docs" / "architecture.md" in files and ROOT / "gateway" / "README.md" in files
    problems = [p for f in files for p in broken_links(f)]
    assert not problems, "\n".join(problems)


# Agent Lightning's own tests, which docs/agent-lightning.md cites by their path in AGL's repository.
_FOREIGN_TESTS = {"tests/server/test_endpoints.py", "tests/test_client.py"}
_CITED_TEST = re.compile(r"\btests/[\w/]+\.(?:py|sh)(?:::(\w+))?")


def test_every_cited_test_exists() -> None:
    """A test a page cites as proof (``tests/x.py`` or ``tests/x.py::name``) is there, and so is ``name``."""
    problems = []
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _CITED_TEST.finditer(line):
                file_part = match.group(0).partition("::")[0]
                if file_part in _FOREIGN_TESTS:
                    continue
                target = ROOT / file_part
                where = f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
                if not target.is_file():
                    problems.append(f"{where} (no such file)")
                elif match.group(1) and not re.search(
                    rf"^\s*(?:async )?def {match.group(1)}\b", target.read_text(encoding="utf-8"), re.M
                ):
                    problems.append(f"{where} (no such test)")
    assert not problems, "\n".join(problems)


def test_the_configuration_reference_is_current() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == config_reference.render(), "stale: run python -m flywheel.config_reference"


def test_every_setting_has_a_meaning() -> None:
    assert config_reference.undocumented() == []
    assert config_reference.unused_meanings() == []


def _results_page() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "results_page", ROOT / "tests" / "benchmarks" / "results_page.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_readme_result_names_the_model_and_task_it_comes_from(tmp_path: Path) -> None:
    results_page = _results_page()
    for item in results_page.reports():
        if item.headline or item.headline_runs or item.demo_headline:
            assert item.model, item.slug
    table = results_page.render_headline(results_page.reports())
    assert "| measured | model · task | figure |" in table
    bare = tmp_path / "99-bare.json"
    bare.write_text(
        json.dumps(
            {
                "title": "t",
                "command": "c",
                "produced_by": "p",
                "headline": [["a", "b"]],
                "tables": [{"caption": "c", "columns": ["x"], "rows": [["1"]]}],
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(results_page.ReportError, match="names its model and task"):
        results_page.load(bare)


def test_the_results_page_and_the_readme_table_are_rendered_from_the_reports() -> None:
    results_page = _results_page()
    items = results_page.reports()
    assert items, "no reports under docs/results/"
    assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == results_page.render_page(items), (
        "stale: run python tests/benchmarks/results_page.py"
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == results_page.with_headline(readme, items), (
        "stale: run python tests/benchmarks/results_page.py"
    )


def test_a_benchmarks_json_output_reaches_the_page_as_it_came(tmp_path: Path) -> None:
    results_page = _results_page()
    report = tmp_path / "01-bench.json"
    report.write_text(
        '{"title": "Bench", "command": "python tests/benchmarks/bus.py --json", "produced_by": "x"}'
    )
    output = {
        "figures": {"kafka_publish_ratio": 1.2345, "events_per_s": 54321.0},
        "goals": {"kafka_publish_ratio": "≥ 0.7"},
    }
    results_page.add_run(report, output, "run A")
    results_page.add_run(report, {"figures": {"kafka_publish_ratio": 0.9}, "goals": {}}, "run B")
    page = results_page.render_page(results_page.reports(tmp_path))
    assert "| figure | goal | run A | run B |" in page
    assert "| `kafka_publish_ratio` | ≥ 0.7 | 1.23 | 0.9 |" in page
    assert "| `events_per_s` |  | 54,321 |  |" in page
    with pytest.raises(results_page.ReportError):
        results_page.add_run(report, {"rows": []}, "not a benchmark")
    raw = tmp_path / "bus.json"  # a --json output committed as it came is a report of its own
    raw.write_text(
        '{"command": "python tests/benchmarks/bus.py --json", "figures": {"x": 2.0}, "goals": {"x": "≥ 1"}}'
    )
    page = results_page.render_page(results_page.reports(tmp_path))
    assert "## Bus: a benchmark's --json output" in page and "| `x` | ≥ 1 | 2 |" in page


def test_a_benchmarks_headline_is_read_from_its_latest_run(tmp_path: Path) -> None:
    """A headline row names figures; the latest run that has all of them fills it in."""
    results_page = _results_page()
    report = tmp_path / "01-bench.json"
    report.write_text(
        json.dumps(
            {
                "title": "Bench",
                "command": "python tests/benchmarks/gateway.py --json",
                "produced_by": "x",
                "model": "no model",
                "headline_runs": [["Throughput / latency", "{ratio:.1f}× / {p50:+.2f} ms"]],
            }
        )
    )
    results_page.add_run(report, {"figures": {"ratio": 4.71, "p50": 1.234}, "goals": {}}, "run A")
    results_page.add_run(report, {"figures": {"ratio": 9.0}, "goals": {}}, "run B (no p50)")
    headline = results_page.render_headline(results_page.reports(tmp_path))
    assert "| [Throughput / latency](docs/results.md#bench) | no model | 4.7× / +1.23 ms |" in headline
    results_page.add_run(report, {"figures": {"ratio": 5.04, "p50": 0.5}, "goals": {}}, "run C")
    assert "5.0× / +0.50 ms" in results_page.render_headline(results_page.reports(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "01-bench.json").write_text(report.read_text().replace('"p50"', '"p99"'))
    with pytest.raises(results_page.ReportError, match="no run has every figure"):
        results_page.render_headline(results_page.reports(empty))


def test_a_demos_report_reaches_the_page_and_the_headline_as_it_came(tmp_path: Path) -> None:
    """A demo's report.json is copied under raw/ as it came; its row and the README's headline figure are
    read from that file, so editing the report's numbers changes the page."""
    results_page = _results_page()
    report = tmp_path / "01-demo.json"
    report.write_text(
        '{"title": "Demo", "command": "flywheel demo", "produced_by": "x", "model": "m", "demo_headline": "Gain"}'
    )
    run = {
        "seed": 3,
        "source": "rollouts",
        "engine": "embedded",
        "before": {"success": 0.25, "calls_per_episode": 2.7148},
        "after": {"success": 0.6367, "calls_per_episode": 2.1016},
        "delta": {"success_points": 38.67},
        "rl_steps": 47,
        "rl_seconds": 421.3,
        "warm_start_gate": {"passed": True},
    }
    demo_report = tmp_path / "out" / "report.json"
    demo_report.parent.mkdir()
    demo_report.write_text(json.dumps(run))
    results_page.add_demo(report, demo_report, "run A")
    copied = tmp_path / "raw" / "01-demo-run1-seed3.json"
    assert copied.read_text() == demo_report.read_text()
    items = results_page.reports(tmp_path)
    page = results_page.render_page(items)
    row = "| 3 | rollouts | embedded | 25.0% (2.71) | 63.7% (2.10) | **+38.7** | 47 | 421.3 | passed |"
    assert row + " [run A](results/raw/01-demo-run1-seed3.json) |" in page
    assert "| [Gain](docs/results.md#demo) | m | +38.7 points (seed 3) |" in results_page.render_headline(
        items
    )
    copied.write_text(json.dumps({**run, "delta": {"success_points": 12.0}}))
    assert "+12.0 points (seed 3)" in results_page.render_headline(results_page.reports(tmp_path))
    with pytest.raises(results_page.ReportError, match=r"not a demo's report\.json"):
        results_page.add_demo(report, report, "not a demo")


def test_a_pretrained_models_run_reports_its_benchmark_score_and_accuracy(tmp_path: Path) -> None:
    """``flywheel demo --model smollm2``: the page's row and the headline give the benchmark's score change
    (partial credit), with the all-or-nothing accuracy beside it."""
    results_page = _results_page()
    report = tmp_path / "16-demo.json"
    report.write_text(
        '{"title": "BFCL", "command": "c", "produced_by": "x", "model": "m", "demo_headline": "BFCL"}'
    )
    run = {
        "seed": 0,
        "source": "rollouts",
        "model": "smollm2",
        "task": "bfcl/simple_python",
        "heldout_tasks": 100,
        "before": {"success": 0.0, "reward": 0.358, "episodes": 100},
        "after": {"success": 0.21, "reward": 0.612, "episodes": 100},
        "delta": {"success_points": 21.0, "reward_points": 25.4},
        "rl_steps": 15,
        "rl_seconds": 1620.0,
    }
    demo_report = tmp_path / "out" / "report.json"
    demo_report.parent.mkdir()
    demo_report.write_text(json.dumps(run))
    results_page.add_demo(report, demo_report, "run A")
    items = results_page.reports(tmp_path)
    row = "| 0 | smollm2 | whole model | bfcl/simple_python | 100 | 35.8 → 61.2 | **+25.4** | 0% → 21% | 15 | 1620 |"
    assert row in results_page.render_page(items)
    assert "| [BFCL](docs/results.md#bfcl) | m | +25.4 points (seed 0) |" in results_page.render_headline(
        items
    )


def _add_demo_runs(results_page: ModuleType, report: Path, runs: tuple[dict[str, Any], ...]) -> None:
    """Each of ``runs`` written as a demo's report.json and added to ``report`` as ``run i``."""
    for i, run in enumerate(runs):
        out = report.parent / f"out{i}" / "report.json"
        out.parent.mkdir()
        out.write_text(json.dumps(run))
        results_page.add_demo(report, out, f"run {i}")


def _demo_page(tmp_path: Path, name: str, command: str, runs: tuple[dict[str, Any], ...]) -> str:
    """The results page of a demo report ``name`` (run with ``command``) holding ``runs``."""
    results_page = _results_page()
    report = tmp_path / name
    report.write_text(json.dumps({"title": "Demo", "command": command, "produced_by": "x"}))
    _add_demo_runs(results_page, report, runs)
    return str(results_page.render_page(results_page.reports(tmp_path)))


def test_a_production_demos_ratings_reach_its_row(tmp_path: Path) -> None:
    """A ``--source production`` run's users' thumbs-up rate (first and last minute) and its rated sessions
    are read from its report.json; a run without them leaves those cells empty."""
    base = {
        "seed": 1,
        "source": "production",
        "before": {"success": 0.256, "calls_per_episode": 2.65},
        "after": {"success": 0.74, "calls_per_episode": 2.06},
        "delta": {"success_points": 48.4},
        "rl_steps": 122,
        "rl_seconds": 420.5,
    }
    rated = {**base, "feedback": 8155, "thumbs_up": {"first_minute": 0.406, "last_minute": 0.733}}
    page = _demo_page(tmp_path, "04-demo.json", "flywheel demo --source production", (rated, base))
    assert "| thumbs up, first → last minute | rated sessions |" in page
    assert "| **+48.4** | 122 | 420.5 | 40.6% → 73.3% | 8,155 |  | [run 0]" in page
    assert "| **+48.4** | 122 | 420.5 |  |  |  | [run 1]" in page


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def _repository_files() -> list[Path]:
    """The files git tracks; without git (an unpacked archive), every file outside hidden folders."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return [
            p for p in ROOT.rglob("*") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        ]
    return [ROOT / name for name in listed.split("\0") if name]


def test_nothing_cites_notes_outside_the_repository() -> None:
    names = ["DESIGN" + ".md", "API-" + "NOTES", "shared/" + "DESIGN"]
    hits = []
    for path in _repository_files():
        if path.suffix not in {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt"} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        hits += [f"{path.relative_to(ROOT)}: {n}" for n in names if n in text]
    assert not hits, "\n".join(hits)


def test_a_demos_sft_only_baseline_reaches_its_row_and_the_headline(tmp_path: Path) -> None:
    """A ``--baseline`` run's equal-time SFT-only result and its gain over the warm start are read from
    its report.json, in the row and in the headline figure; a run without one leaves those cells empty."""
    results_page = _results_page()
    report = tmp_path / "02-demo.json"
    report.write_text(
        '{"title": "Demo", "command": "flywheel demo --baseline", "produced_by": "x", "model": "m", "demo_headline": "Gain"}'
    )
    base = {
        "seed": 0,
        "source": "rollouts",
        "before": {"success": 0.533, "calls_per_episode": 2.98},
        "after": {"success": 0.879, "calls_per_episode": 2.21},
        "delta": {"success_points": 34.6},
        "rl_steps": 136,
        "rl_seconds": 390.2,
    }
    with_baseline = {**base, "sft_only_baseline": {"success": 0.725, "calls_per_episode": 3.09}}
    _add_demo_runs(results_page, report, (with_baseline, {**base, "sft_only_baseline": None}))
    items = results_page.reports(tmp_path)
    page = results_page.render_page(items)
    assert "| Δ points | SFT only, equal time | Δ SFT only | RL steps |" in page
    assert "| **+34.6** | 72.5% (3.09) | +19.2 | 136 |" in page
    assert "| **+34.6** |  |  | 136 |" in page
    assert "(SFT only, equal time: +19.2)" in results_page.render_headline(items)


def test_a_curriculum_runs_revisit_and_groups_without_signal_reach_its_row(tmp_path: Path) -> None:
    """The share of trained groups without signal is read from a seed's per-step figures (``steps``) and
    the curriculum's revisit probability from its report; a run without them leaves the cells empty."""
    base = {
        "seed": 0,
        "source": "rollouts",
        "before": {"success": 0.5, "calls_per_episode": 2.9},
        "after": {"success": 0.82, "calls_per_episode": 2.3},
        "delta": {"success_points": 32.0},
        "rl_steps": 2,
        "rl_seconds": 390.0,
    }
    steps = [{"groups": 8.0, "groups_zero_variance": 2.0}, {"groups": 8.0, "groups_zero_variance": 1.0}]
    runs = ({**base, "curriculum": {"revisit": 0.5}, "steps": steps}, base)
    page = _demo_page(tmp_path, "03-demo.json", "flywheel demo --curriculum 0.5", runs)
    assert "| curriculum revisit | trained groups without signal | RL steps |" in page
    assert "| **+32.0** | 0.5 | 19% | 2 | 390 |" in page
    assert "| **+32.0** |  |  | 2 | 390 |" in page


def test_a_vllm_runs_weight_updates_reach_its_row(tmp_path: Path) -> None:
    """A run on an engine other than the embedded one shows its median weight update (drain + load ms)
    over the steps that made one, read from its report's ``steps``."""
    steps = [
        {"drain_ms": 0.0, "load_ms": 0.0},  # the first step: nothing served yet to update
        {"drain_ms": 200.0, "load_ms": 90.0},
        {"drain_ms": 240.0, "load_ms": 110.0},
        {"drain_ms": 1200.0, "load_ms": 100.0},
    ]
    run = {
        "seed": 0,
        "source": "rollouts",
        "engine": "vllm",
        "before": {"success": 0.25, "calls_per_episode": 2.6},
        "after": {"success": 0.65, "calls_per_episode": 2.2},
        "delta": {"success_points": 40.0},
        "rl_steps": 3,
        "rl_seconds": 420.0,
        "steps": steps,
    }
    page = _demo_page(tmp_path, "01b-demo.json", "flywheel demo --engine vllm", (run, {**run, "steps": None}))
    assert "| RL steps | RL s | weight update, median ms (drain + load) | warm-start gate |" in page
    assert "| **+40.0** | 3 | 420 | 240 + 100 |  | [run 0]" in page
    assert "| **+40.0** | 3 | 420 |  |  | [run 1]" in page


def test_full_per_role_and_shared_runs_compare_in_one_table_and_headline(tmp_path: Path) -> None:
    """A page with ``--policies`` runs compares the configurations: each policy's updates, bytes per
    update (an adapter's, or the whole model's for the full fine-tune) and mean seconds per update, read
    from the report's ``updates_by_policy``; a full run from before ``policies_config`` counts as full."""

    def run(config: str | None, seed: int, gain: float, updates: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "seed": seed,
            "source": "rollouts",
            "before": {"success": 0.5, "calls_per_episode": 3.0},
            "after": {"success": 0.5 + gain / 100, "calls_per_episode": 2.5},
            "delta": {"success_points": gain},
            "rl_steps": 10,
            "rl_seconds": 390.0,
            **({"policies_config": config} if config else {}),
            "updates_by_policy": updates,
        }

    def entry(n: int, seconds: float, adapter: int | None = None, model: int | None = None) -> dict[str, Any]:
        sizes = {"adapter_bytes": adapter, **({"model_bytes": model} if model else {})}
        return {"updates": n, "seconds_per_update": {"mean": seconds}, **sizes}

    runs = (
        run(None, 0, 35.4, None),
        run("full", 1, 31.8, {"policy": entry(156, 1.03, model=3_649_672)}),
        run("per-role", 0, 20.0, {"writer": entry(80, 0.5, 65_536), "rewriter": entry(75, 0.4, 65_536)}),
        run("shared", 0, 25.0, {"shared": entry(150, 0.6, 65_536)}),
    )
    results_page = _results_page()
    report = tmp_path / "02b-demo.json"
    report.write_text(json.dumps({"title": "Policies", "command": "flywheel demo --agent sql", "produced_by": "x",
                                  "model": "m", "demo_headline": "SQL policies"}))  # fmt: skip
    _add_demo_runs(results_page, report, runs)
    items = results_page.reports(tmp_path)
    page = str(results_page.render_page(items))
    assert "| seed | policies | warm start (calls/episode) | after RL | Δ points | updates |" in page
    assert "| 0 | full | 50.0% (3.00) | 85.4% (2.50) | **+35.4** |  |  |  | 10 | 390 | [run 0]" in page
    assert "| **+31.8** | 156 | 3,649,672 | 1.03 | 10 | 390 |" in page
    # by seed, then full, per-role, shared
    assert page.index("[run 0]") < page.index("[run 2]") < page.index("[run 3]") < page.index("[run 1]")
    assert "| per-role | 50.0% (3.00) | 70.0% (2.50) | **+20.0** | rewriter 75 · writer 80 |" in page
    assert "| rewriter 65,536 · writer 65,536 | rewriter 0.4 · writer 0.5 |" in page
    assert "| shared | 50.0% (3.00) | 75.0% (2.50) | **+25.0** | 150 | 65,536 | 0.6 |" in page
    headline = str(results_page.render_headline(items))
    assert "full +35.4, +31.8 · per-role +20.0 · shared +25.0 points (seeds 0, 1)" in headline


def test_a_reports_digits_keep_a_ratios_distance_from_one(tmp_path: Path) -> None:
    """A report that sets ``digits`` shows its runs' figures to that many significant digits (a logprob
    ratio of 0.999959 must not read as 1); without it, two decimals."""
    results_page = _results_page()
    output = {"figures": {"ratio_min": 0.999959, "tokens": 1234, "tok_s": 3491.135}, "goals": {}}
    for name, digits, shown in (
        ("15-a.json", 6, "| `ratio_min` |  | 0.999959 |"),
        ("15-b.json", None, "| 1 |"),
    ):
        report = tmp_path / name
        raw = {"title": name, "command": "python x.py --json", "produced_by": "x", "digits": digits}
        report.write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
        results_page.add_run(report, output, "run A")
        page = results_page.render_page([results_page.load(report)])
        assert shown in page and "| `tokens` |  | 1,234 |" in page and "| `tok_s` |  | 3,491 |" in page
