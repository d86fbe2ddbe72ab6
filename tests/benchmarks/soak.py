"""Soak: the embedded stack under steady agent traffic for a long time: is memory flat, is nothing lost?

    python tests/benchmarks/soak.py [--json] [--minutes 30] [--agents 16] [--no-trainer]
    python tests/benchmarks/soak.py --minutes 4 --agents 4 --trace /tmp/soak-trace   # where memory goes

``flywheel up --tiny`` runs in a child process (every service in one process, the trainer's backend in a
child of its own, as an operator runs it). ``--agents`` agents call it back to back through the
``openai`` SDK, each cycling through four kinds of work, three chat calls each (the conversation grows,
so the gateway's tokens-in path is taken):

- a training episode opened through the admin API and finished with a reward (two of four);
- a training episode opened and never finished (an agent that crashed): the services must forget it;
- a production session with a tenant key, rated on ``/v1/feedback``; every other one is ended, the rest
  are left for the reward service's idle timeout.

The trainer (unless ``--no-trainer``) steps on what is scored, and loads every version into the engine.

Figures: calls answered, failed, recorded in the event log and lost (answered but not recorded); the
RSS of each process of the tree (``stack``: the ``flywheel up`` process; ``trainer``: its backend child)
at minute 2, at minute 5 and at the end; the slope of the tree's RSS against calls served, in KB per
1,000 calls, and of the stack process's allocated interpreter blocks (``sys.getallocatedblocks()``)
per call, both Theil–Sen (the median of the pairwise slopes) from minute 5 (a fifth of a shorter run)
to the end; p50 and p99 of a chat call, and their drift (the end over minute 5, or over the fitted
window's first minute in a run shorter than 6 minutes). Per minute (``by_minute`` in ``--json``): p50
and p99, mean completion tokens a call (so a drift of the model's answers shows apart from the stack's),
the trainer's steps, and CPU ms a call served by each thread group of the stack process (its threads by
name: ``python`` for the interpreter's and torch's, ClickHouse's own for chdb) and by each child
process. The heap slope is what a short run can show: RSS warms up for minutes (malloc arenas, torch's
and chdb's high-water marks), while a structure that grows with the calls served shows in the heap at
once.

A reading "at" a time pools a window, because one sample is noise on two shared cores: RSS is each
process's median over the samples of the minute around it (one sample swings by ±40 MB with a forward
pass's buffers), and in a run of 15 minutes or more the latency quantiles pool three minutes of calls,
minutes 4–6 for "minute 5" and the last three for "the end" (a single minute's p99 moved between 195
and 425 ms within one 30-minute run with no trend). The single-sample and single-minute ratios are
reported beside them (``rss_ratio_last_vs_base_sample``, ``p99_drift_last_minute``).

Goals (a 30-minute run): nothing lost; RSS at the end ≤ 1.05 × RSS at minute 5; p99 at the end ≤ 1.5 ×
p99 at minute 5; RSS slope ≤ ``SLOPE_BOUND_KB`` KB per 1,000 calls.

``--trace PREFIX``: ``tracemalloc`` (8 frames) starts in the stack process at the start of the fitted
window and a snapshot is taken at the end; what it holds was allocated in the window and is still
alive, printed by where it was allocated, with its size per call served in the window (tracing slows
the stack: use it for a few minutes at low concurrency, and read its RSS figures as tracemalloc's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
FLYWHEEL = str(Path(PY).with_name("flywheel"))
TOKEN = "soak-admin-token-0123456789abcdef"
# KB of RSS per 1,000 calls past warm-up: 1 KB a call (keeping every call event was 22,000)
SLOPE_BOUND_KB = 1_000.0
QUESTIONS = [f"What is {a} plus {b}?" for a in range(1, 10) for b in range(1, 10)]

# ``flywheel up`` itself; with SOAK_TRACE, each SIGUSR1 dumps a tracemalloc snapshot (numbered files), the
# first one starting the trace: what the second holds was allocated after the first and is still alive.
STACK = textwrap.dedent(
    """
    import os, signal, sys
    trace = os.environ.pop("SOAK_TRACE", "")
    if trace:
        import tracemalloc
        taken = [0]
        def snapshot(signum, frame):
            taken[0] += 1
            if not tracemalloc.is_tracing():
                tracemalloc.start(8)
            tracemalloc.take_snapshot().dump(f"{trace}.{taken[0]}")
            if taken[0] == 2:  # and without the cyclic garbage (the bus's GC policy holds some frozen)
                import gc
                gc.unfreeze()
                gc.collect()
                tracemalloc.take_snapshot().dump(f"{trace}.3")
            open(f"{trace}.{taken[0]}.done", "w").close()
        signal.signal(signal.SIGUSR1, snapshot)
    blocks = os.environ.pop("SOAK_BLOCKS", "")
    if blocks:  # SIGUSR2: the interpreter's allocated blocks, numbered, into that file
        asked = [0]
        def count(signum, frame):
            asked[0] += 1
            with open(blocks + ".tmp", "w") as f:
                f.write(f"{asked[0]} {sys.getallocatedblocks()}")
            os.replace(blocks + ".tmp", blocks)
        signal.signal(signal.SIGUSR2, count)
    from flywheel.cli.main import app
    sys.argv = ["flywheel", *sys.argv[1:]]
    app()
    """
)


@dataclass
class Tally:
    answered: int = 0
    failed: int = 0
    episodes: dict[str, int] = field(default_factory=dict)  # kind -> count
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (t since start, seconds)
    tokens: list[tuple[float, int, int]] = field(default_factory=list)  # (t, prompt, completion tokens)
    errors: list[str] = field(default_factory=list)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tree(root: psutil.Process) -> dict[str, float]:
    """RSS in MB of the stack process and each of its descendants, by role."""
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss / 2**20
            if proc.pid == root.pid:
                role = "stack"
            else:
                cmd = " ".join(proc.cmdline())
                role = "trainer" if "trainer" in cmd or "multiprocessing" in cmd else proc.name()
            out[role] = out.get(role, 0.0) + rss
    return out


async def _agent(
    i: int,
    url: str,
    key: str,
    tally: Tally,
    t0: float,
    stop_at: float,
    http: httpx.AsyncClient,
) -> None:
    from openai import AsyncOpenAI

    admin = {"Authorization": f"Bearer {TOKEN}"}
    n = 0
    while time.monotonic() < stop_at:
        kind = ("finished", "abandoned", "finished", "production")[(n + i) % 4]
        question = QUESTIONS[(n * 7 + i) % len(QUESTIONS)]
        n += 1
        headers: dict[str, str] = {}
        session = f"agent{i}-s{n}"
        try:
            if kind == "production":
                base, api_key, headers = f"{url}/v1", key, {"X-Flywheel-Session": session}
            else:
                r = await http.post(f"{url}/admin/episodes", json={}, headers=admin)
                r.raise_for_status()
                episode_id, base, api_key = r.json()["episode_id"], r.json()["base_url"], "unused"
            client = AsyncOpenAI(base_url=base, api_key=api_key, http_client=http, max_retries=0)
            messages: list[Any] = [{"role": "user", "content": question}]
            for turn in range(3):
                started = time.monotonic()
                try:
                    reply = await client.chat.completions.create(
                        model="policy",
                        messages=messages,
                        max_tokens=8,
                        extra_headers=headers,
                    )
                except Exception as exc:
                    tally.failed += 1
                    if len(tally.errors) < 20:
                        tally.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    break
                tally.answered += 1
                tally.latencies.append((started - t0, time.monotonic() - started))
                if reply.usage is not None:
                    tally.tokens.append(
                        (started - t0, reply.usage.prompt_tokens, reply.usage.completion_tokens)
                    )
                text = reply.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"And {turn}?"},
                ]
            if kind == "finished":
                await http.post(
                    f"{url}/admin/episodes/{episode_id}/finish",
                    json={"status": "ok", "reward": float(n % 2)},
                    headers=admin,
                )
            elif kind == "production":
                auth = {"Authorization": f"Bearer {key}"}
                await http.post(
                    f"{url}/v1/feedback",
                    json={"session_id": session, "rating": 1 - 2 * (n % 2)},
                    headers=auth,
                )
                if n % 8 < 4:  # the others are left to the reward service's idle timeout
                    await http.post(f"{url}/v1/sessions/{session}/end", headers=auth)
            tally.episodes[kind] = tally.episodes.get(kind, 0) + 1
        except Exception as exc:
            tally.failed += 1
            if len(tally.errors) < 20:
                tally.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(0.5)


def _blocks(root: psutil.Process, path: Path, n: int) -> int | None:
    """The stack process's ``sys.getallocatedblocks()``, asked for the ``n``-th time (SIGUSR2)."""
    with contextlib.suppress(psutil.Error):
        root.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            seq, count = path.read_text().split()
            if int(seq) >= n:
                return int(count)
        time.sleep(0.05)
    return None


def _cpu(root: psutil.Process) -> dict[str, float]:
    """CPU seconds so far: the stack process's threads by name (``python`` for the interpreter's and
    torch's, ClickHouse's own for chdb: ``MergeMutate``, ``ThreadPool``, …) and each child's total."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{root.pid}/task").glob("*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            role = "trainer" if "trainer" in " ".join(child.cmdline()) else child.name()
            out[f"child:{role}"] = out.get(f"child:{role}", 0.0) + times.user + times.system
    return out


async def _sampler(
    root: psutil.Process,
    url: str,
    tally: Tally,
    t0: float,
    stop_at: float,
    every_s: float,
    out: list[dict[str, Any]],
    blocks: Path,
) -> None:
    while True:
        now = time.monotonic()
        rss = await asyncio.to_thread(_tree, root)
        heap = await asyncio.to_thread(_blocks, root, blocks, len(out) + 1)
        cpu = await asyncio.to_thread(_cpu, root)
        step = await asyncio.to_thread(_trainer_step, url)
        chdb = await asyncio.to_thread(_chdb_mb, url)
        load = os.getloadavg()[0]
        out.append(
            {
                "t": now - t0,
                "calls": tally.answered,
                "rss": rss,
                "blocks": heap,
                "chdb_mb": chdb,
                "load1": load,
                "cpu": cpu,
                "trainer_step": step,
            }
        )
        if now >= stop_at:
            return
        await asyncio.sleep(min(every_s, max(0.0, stop_at - now)))


def _at(samples: list[dict[str, Any]], t: float) -> dict[str, Any]:
    return min(samples, key=lambda s: abs(s["t"] - t))


def _rss_around(samples: list[dict[str, Any]], lo: float, hi: float) -> dict[str, float]:
    """Each process's median RSS over the samples in ``[lo, hi)`` (the nearest sample if none): one
    sample catches a transient (a forward pass's buffers, a batch being written) as often as not."""
    window = [s for s in samples if lo <= s["t"] < hi] or [_at(samples, (lo + hi) / 2)]
    roles = {role for s in window for role in s["rss"]}
    return {role: statistics.median(s["rss"].get(role, 0.0) for s in window) for role in sorted(roles)}


def _theil_sen(points: list[tuple[float, float]]) -> float:
    """The median of the slopes between every two points: a sawtooth (cyclic garbage waiting for the GC
    policy's release, malloc keeping what it freed for a while) pulls a least-squares line about, while
    a structure that grows with every call moves every pair."""
    slopes = [
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 > x1
    ]
    return statistics.median(slopes) if slopes else 0.0


def _slope_kb_per_1k(samples: list[dict[str, Any]]) -> float:
    """The tree's RSS against calls served, in KB per 1,000 calls."""
    return _theil_sen([(float(s["calls"]), float(sum(s["rss"].values())) * 1024) for s in samples]) * 1000


def _blocks_per_call(samples: list[dict[str, Any]]) -> float | None:
    """The stack process's allocated interpreter blocks against calls served, per call."""
    points = [(float(s["calls"]), float(s["blocks"])) for s in samples if s["blocks"] is not None]
    return _theil_sen(points) if len(points) >= 3 else None


def _minute(latencies: list[tuple[float, float]], lo: float, hi: float) -> tuple[float, float]:
    window = sorted(d for t, d in latencies if lo <= t < hi)
    if len(window) < 2:
        return 0.0, 0.0
    q = statistics.quantiles(window, n=100)
    return q[49] * 1000, q[98] * 1000


def _by_minute(tally: Tally, samples: list[dict[str, Any]], m: int) -> dict[str, Any]:
    """Minute ``m`` (from 0) of the run: latency, completion tokens, trainer steps, CPU a call, and where
    the stack process's memory is (its RSS, chdb's own tracked memory, the interpreter's blocks)."""
    lo, hi = m * 60, m * 60 + 60
    p50, p99 = _minute(tally.latencies, lo, hi)
    return {
        "minute": m + 1,
        "p50_ms": round(p50, 1),
        "p99_ms": round(p99, 1),
        "completion_tokens": _mean_tokens(tally.tokens, lo, hi, 2),
        **_minute_work(samples, lo, hi),
        **_minute_memory(samples, lo, hi),
    }


def _median_of(
    samples: list[dict[str, Any]], lo: float, hi: float, read: Callable[[dict[str, Any]], Any]
) -> Any:
    """The median of ``read(sample)`` over the samples in ``[lo, hi)`` that have it (None if none do)."""
    values = [v for s in samples if lo <= s["t"] < hi and (v := read(s)) is not None]
    return statistics.median(values) if values else None


def _minute_memory(samples: list[dict[str, Any]], lo: float, hi: float) -> dict[str, Any]:
    stack = _median_of(samples, lo, hi, lambda s: s["rss"].get("stack"))
    chdb = _median_of(samples, lo, hi, lambda s: s.get("chdb_mb"))
    blocks = _median_of(samples, lo, hi, lambda s: s.get("blocks"))
    return {
        "rss_mb_stack": _round(stack),
        "chdb_mb": _round(chdb),
        "heap_blocks": None if blocks is None else int(blocks),
    }


def _minute_work(samples: list[dict[str, Any]], lo: float, hi: float) -> dict[str, Any]:
    """Between the samples nearest ``lo`` and ``hi``: the trainer's steps, and CPU ms a call served by
    each thread group of the stack process and each child (where the time goes as the run ages)."""
    a, b = _at(samples, lo), _at(samples, hi)
    calls = b["calls"] - a["calls"]
    steps = None
    if a.get("trainer_step") is not None and b.get("trainer_step") is not None:
        steps = b["trainer_step"] - a["trainer_step"]
    cpu = {
        k: round(1000 * (b["cpu"][k] - a["cpu"].get(k, 0.0)) / calls, 2)
        for k in b.get("cpu", {})
        if calls > 0 and b["cpu"][k] - a["cpu"].get(k, 0.0) > 0
    }
    return {"calls": calls, "trainer_steps": steps, "cpu_ms_per_call": cpu}


def _mean_tokens(tokens: list[tuple[float, int, int]], lo: float, hi: float, column: int) -> float | None:
    """Mean prompt (``column`` 1) or completion (2) tokens a call in ``[lo, hi)``."""
    window = [row[column] for row in tokens if lo <= row[0] < hi]
    return round(statistics.fmean(window), 2) if window else None


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"flywheel up exited with {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            time.sleep(0.5)
    raise RuntimeError("flywheel up did not become ready")


def _snapshot(proc: subprocess.Popen[bytes], trace: Path, n: int) -> None:
    proc.send_signal(signal.SIGUSR1)
    done = Path(f"{trace}.{n}.done")
    deadline = time.monotonic() + 600
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


def _trace_report(trace: Path, calls: int, top: int = 20) -> list[dict[str, Any]]:
    import tracemalloc

    first = tracemalloc.Snapshot.load(f"{trace}.1")
    last = tracemalloc.Snapshot.load(f"{trace}.2")
    alive = tracemalloc.Snapshot.load(f"{trace}.3")
    held, garbage = (
        sum(s.size for s in last.statistics("filename")),
        sum(s.size for s in alive.statistics("filename")),
    )
    out: list[dict[str, Any]] = [
        {
            "kb": round(held / 1024, 1),
            "bytes_per_call": round(held / max(calls, 1), 1),
            "count_diff": 0,
            "where": ["all traced (allocated in the window, still held)"],
            "lib": [],
        },
        {
            "kb": round((held - garbage) / 1024, 1),
            "bytes_per_call": round((held - garbage) / max(calls, 1), 1),
            "count_diff": 0,
            "where": ["of which cyclic garbage (freed by gc.unfreeze + gc.collect)"],
            "lib": [],
        },
    ]
    for stat in alive.compare_to(first, "traceback")[:top]:
        frames = [f"{f.filename.removeprefix(str(ROOT) + '/')}:{f.lineno}" for f in stat.traceback]
        out.append(
            {
                "kb": round(stat.size_diff / 1024, 1),
                "bytes_per_call": round(stat.size_diff / max(calls, 1), 1),
                "count_diff": stat.count_diff,
                "where": [f for f in frames if "site-packages" not in f][-4:] or frames[-3:],
                "lib": [f.split("site-packages/")[-1] for f in frames if "site-packages" in f][-2:],
            }
        )
    return out


def run(
    minutes: float,
    agents: int,
    *,
    trainer: bool = True,
    sample_s: float = 15.0,
    trace: Path | None = None,
    env_extra: dict[str, str] | None = None,
    fit_from_s: float | None = None,
) -> dict[str, Any]:
    """Run the soak (module docstring); ``fit_from_s``: where the fitted window starts (default: minute
    5, or a fifth of a shorter run)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-soak-") as tmp:
        data = Path(tmp) / "data"
        port = _port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "FLYWHEEL_ADMIN_TOKEN": TOKEN,
                "FLYWHEEL_DATA_DIR": str(data),
                "FLYWHEEL_TRAINER_TORCH_THREADS": "1",
                "FLYWHEEL_ENGINE_THREADS": "1",
                "FLYWHEEL_TRAINER_BATCH_GROUPS": "4",
                **(env_extra or {}),
            }
        )
        if trace is not None:
            trace.parent.mkdir(parents=True, exist_ok=True)
            env["SOAK_TRACE"] = str(trace)
        env["SOAK_BLOCKS"] = str(Path(tmp) / "blocks")
        args = [PY, "-c", STACK, "up", "--tiny", "--port", str(port), "--data-dir", str(data)]
        if not trainer:
            args.append("--no-trainer")
        log_path = Path(tmp) / "up.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            _wait_ready(proc, url, log_path)
            created = subprocess.run(
                [FLYWHEEL, "keys", "create", "--tenant", "soak"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            key = created.stdout.strip()
            fit_from = fit_from_s if fit_from_s is not None else min(300.0, minutes * 60 / 5)
            result = asyncio.run(
                _drive(
                    proc,
                    url,
                    key,
                    minutes,
                    agents,
                    sample_s,
                    trace,
                    fit_from,
                    Path(tmp) / "blocks",
                )
            )
            result["trainer_step"] = _trainer_step(url)
            result["gateway_open_episodes_end"] = _open_episodes(url)
            result["recorded"] = _recorded(url, result["answered"])
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if trace is not None:
            result["trace"] = _trace_report(trace, result["traced_calls"])
        result["log_tail"] = log_path.read_text(errors="replace")[-1500:] if proc.returncode else ""
        return result


async def _drive(
    proc: subprocess.Popen[bytes],
    url: str,
    key: str,
    minutes: float,
    agents: int,
    sample_s: float,
    trace: Path | None,
    fit_from: float,
    blocks: Path,
) -> dict[str, Any]:
    tally = Tally()
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    duration = minutes * 60
    stop_at = t0 + duration
    root = psutil.Process(proc.pid)
    limits = httpx.Limits(max_connections=agents * 2, max_keepalive_connections=agents * 2)
    traced_from = 0
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        sampler = asyncio.create_task(_sampler(root, url, tally, t0, stop_at, sample_s, samples, blocks))
        tasks = [asyncio.create_task(_agent(i, url, key, tally, t0, stop_at, http)) for i in range(agents)]
        if trace is not None:
            await asyncio.sleep(fit_from)
            traced_from = tally.answered
            await asyncio.to_thread(_snapshot, proc, trace, 1)
        await asyncio.gather(*tasks)
        if trace is not None:
            await asyncio.to_thread(_snapshot, proc, trace, 2)
        await sampler
    end = samples[-1]["t"]
    fitted = [s for s in samples if s["t"] >= fit_from]
    base_t = 300.0 if duration >= 360 else fit_from
    # A reading "at" a time pools a window around it (module docstring): three minutes of calls for the
    # quantiles and a minute of samples for RSS in a run long enough to hold them apart, else one minute.
    half = 90.0 if duration >= 900 else 30.0
    p50_base, p99_base = _minute(tally.latencies, base_t - 30 - half, base_t - 30 + half)
    p50_end, p99_end = _minute(tally.latencies, end - 2 * half, end)
    _, p99_base_minute = _minute(tally.latencies, base_t - 60, base_t)
    _, p99_end_minute = _minute(tally.latencies, end - 60, end)
    rss2 = _rss_around(samples, 90.0, 150.0)
    rss5 = _rss_around(samples, base_t - 30, base_t + 30)
    rss_end = _rss_around(samples, end - 60, end + 1)
    chdb5 = _median_of(samples, base_t - 30, base_t + 30, lambda s: s.get("chdb_mb"))
    chdb_end = _median_of(samples, end - 60, end + 1, lambda s: s.get("chdb_mb"))
    return {
        "minutes": round(end / 60, 2),
        "agents": agents,
        "answered": tally.answered,
        "failed": tally.failed,
        "episodes": tally.episodes,
        "errors": tally.errors,
        "rss_mb_min2": {k: round(v, 1) for k, v in rss2.items()},
        "rss_mb_min5": {k: round(v, 1) for k, v in rss5.items()} if duration >= 300 else None,
        "rss_mb_end": {k: round(v, 1) for k, v in rss_end.items()},
        "rss_ratio_end_vs_base": round(
            sum(rss_end.values()) / sum((rss5 if duration >= 300 else rss2).values()), 4
        ),
        "rss_ratio_last_vs_base_sample": round(
            sum(samples[-1]["rss"].values()) / sum(_at(samples, base_t)["rss"].values()), 4
        ),
        "chdb_mb_min5": _round(chdb5),
        "chdb_mb_end": _round(chdb_end),
        "slope_kb_per_1k_calls": round(_slope_kb_per_1k(fitted), 1),
        "heap_blocks_per_call": _round(_blocks_per_call(fitted)),
        "latency_base_minute": base_t / 60,
        "p50_ms_base": round(p50_base, 1),
        "p99_ms_base": round(p99_base, 1),
        "p50_ms_end": round(p50_end, 1),
        "p99_ms_end": round(p99_end, 1),
        "p99_drift": round(p99_end / p99_base, 3) if p99_base else None,
        "latency_window_minutes": round(2 * half / 60, 1),
        "p99_drift_last_minute": round(p99_end_minute / p99_base_minute, 3) if p99_base_minute else None,
        "completion_tokens_base": _mean_tokens(tally.tokens, base_t - 60, base_t, 2),
        "completion_tokens_end": _mean_tokens(tally.tokens, end - 60, end, 2),
        "prompt_tokens_base": _mean_tokens(tally.tokens, base_t - 60, base_t, 1),
        "prompt_tokens_end": _mean_tokens(tally.tokens, end - 60, end, 1),
        "by_minute": [_by_minute(tally, samples, m) for m in range(int(end // 60))],
        "p50_drift": round(p50_end / p50_base, 3) if p50_base else None,
        "load1_median": round(statistics.median(s["load1"] for s in samples), 2),
        "samples": [
            {
                "t": round(s["t"]),
                "calls": s["calls"],
                "rss": {k: round(v) for k, v in s["rss"].items()},
                "blocks": s["blocks"],
                "chdb_mb": _round(s.get("chdb_mb")),
                "load1": round(s["load1"], 1),
                "trainer_step": s["trainer_step"],
            }
            for s in samples
        ],
        "traced_calls": tally.answered - traced_from,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _trainer_step(url: str) -> int | None:
    with contextlib.suppress(Exception):
        r = httpx.get(f"{url}/admin/ops/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        step = r.json().get("control", {}).get("trainer_step")
        return int(step) if step is not None else 0
    return None


def _chdb_mb(url: str) -> float | None:
    """The memory chdb tracks itself (ClickHouse's ``MemoryTracking``: caches, parts, merges), in MB."""
    sql = "SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'"
    with contextlib.suppress(Exception):
        r = httpx.post(
            f"{url}/admin/eventlog/query",
            json={"sql": sql},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        return int(r.json()["rows"][0][0]) / 2**20
    return None


def _open_episodes(url: str) -> int | None:
    with contextlib.suppress(Exception):
        admin = {"Authorization": f"Bearer {TOKEN}"}
        return int(httpx.get(f"{url}/admin/state", headers=admin, timeout=30).json()["open_episodes"])
    return None


def _recorded(url: str, answered: int) -> int:
    """Calls the event log holds, once the recorder has written what it had (waits up to a minute)."""
    sql = "SELECT count() FROM flywheel.events WHERE type = 'llm_call_recorded'"
    n = -1
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                r = client.post(f"{url}/admin/eventlog/query", json={"sql": sql})
                n = int(r.json()["rows"][0][0])
                if n >= answered:
                    return n
            time.sleep(2)
    return n


def flat_figures(result: dict[str, Any]) -> dict[str, Any]:
    """The run's figures, one level deep (``rss_mb_end: {"stack": …}`` becomes ``rss_mb_end_stack``)."""
    figures: dict[str, Any] = {}
    for key, value in result.items():
        if key in ("samples", "log_tail", "trace", "by_minute"):
            continue
        if isinstance(value, dict):
            figures.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            figures[key] = value
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--sample-s", type=float, default=15.0)
    ap.add_argument("--no-trainer", action="store_true")
    ap.add_argument(
        "--idle-timeout-s", type=float, default=None, help="FLYWHEEL_IDLE_TIMEOUT_S (default: the stack's)"
    )
    ap.add_argument("--trace", type=Path, default=None, help="tracemalloc snapshots under this path prefix")
    a = ap.parse_args()
    env = {"FLYWHEEL_IDLE_TIMEOUT_S": str(a.idle_timeout_s)} if a.idle_timeout_s is not None else None
    r = run(
        a.minutes,
        a.agents,
        trainer=not a.no_trainer,
        sample_s=a.sample_s,
        trace=a.trace,
        env_extra=env,
    )
    lost = r["answered"] - r["recorded"]
    figures = flat_figures(r)
    figures["lost"] = lost
    # The goals as the other benchmarks state them: a bound on a figure of the same name.
    goals = {
        "lost": "= 0",
        "failed": "= 0",
        "slope_kb_per_1k_calls": f"≤ {SLOPE_BOUND_KB:g}",
        "rss_ratio_end_vs_base": "≤ 1.05",
        "p99_drift": "≤ 1.5",
    }
    met = {
        "lost": lost <= 0,
        "failed": r["failed"] == 0,
        "slope_kb_per_1k_calls": r["slope_kb_per_1k_calls"] <= SLOPE_BOUND_KB,
        "rss_ratio_end_vs_base": r["rss_ratio_end_vs_base"] <= 1.05,
        "p99_drift": r["p99_drift"] is not None and r["p99_drift"] <= 1.5,
    }
    if a.json:
        trace = {"trace": r["trace"]} if r.get("trace") else {}
        out = {"figures": figures, "goals": goals, "by_minute": r["by_minute"], "samples": r["samples"]}
        print(json.dumps({**out, **trace}, indent=1))
        return
    for k, v in figures.items():
        print(f"{k:28} {v}")
    for row in r.get("trace", []):
        print(
            f"{row['kb']:>10} KB {row['bytes_per_call']:>8} B/call  {row['count_diff']:>7}  {row['where']} {row['lib']}"
        )
    print("goals:", {k: f"{goal} ({'met' if met[k] else 'missed'})" for k, goal in goals.items()})
    if r["log_tail"]:
        print(r["log_tail"])


if __name__ == "__main__":
    main()
