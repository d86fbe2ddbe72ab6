"""Releases end to end through the embedded stack's real services (docs/operating.md, "Releasing versions").

``FLYWHEEL_RELEASES=gated``: the trainer proposes a candidate every version, the gate keeper evaluates
each through the rollout workers (``mode=val``, the calls naming ``policy@vN`` and served by the
gateway's evaluation slot) against the served version, and production calls (a tenant key's sessions)
are served by the served slot. Training rollouts keep going to the trainer's latest weights.

- A gate no candidate can pass: training moves the latest on, every production call is answered and
  recorded at version 0, no candidate is ever promoted, and the admin API refuses a failed version, an
  unknown one and a rollback with nothing to roll back to, changing nothing.
- A gate every candidate passes: the gate promotes; production calls are recorded at the promoted
  version; a rollback under concurrent production load answers every call (no 5xx, every call recorded)
  and the next call is served by version 0; an operator's promotion survives a restart of every service.
"""

from __future__ import annotations

import asyncio
import json
from itertools import repeat
from pathlib import Path
from typing import Any

import httpx
import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from gateway.keys import KeyStore
from infra.bus.base import Message
from infra.releases import parse_versioned
from schemas import (
    CONTROL,
    EPISODES,
    AgentKind,
    AgentRef,
    EpisodeSource,
    EpisodeStarted,
    LLMCallRecorded,
    Task,
    VersionCanary,
    VersionEvaluated,
    VersionPromoted,
    VersionProposed,
    VersionRolledBack,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

AGENT = "examples.agents_for_tests.two_roles_agent:run"
TOKEN = "releases-e2e-admin-token-0123456789abcdef"
QUESTIONS = ["What is 2 plus 3?", "What is 4 plus 1?", "What is 7 plus 2?"]


class Log:
    """Every control event and recorded call, and which episodes are production sessions."""

    def __init__(self) -> None:
        self.control: list[Any] = []
        self.calls: list[LLMCallRecorded] = []
        self.production: set[str] = set()
        self.sessions: dict[str, str] = {}  # session id → its episode
        self.models: dict[str, str] = {}  # episode → the model it asked for

    async def on(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, LLMCallRecorded):
            self.calls.append(event)
        elif isinstance(event, EpisodeStarted):
            self.models[event.episode_id] = event.model
            if event.source is EpisodeSource.production:
                self.production.add(event.episode_id)
                self.sessions[event.session_id or ""] = event.episode_id
        else:
            self.control.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.control if isinstance(e, kind)]

    def production_versions(self) -> list[int]:
        return [c.weight_version for c in self.calls if c.episode_id in self.production]

    def evaluation_versions(self) -> list[tuple[int, int]]:
        """(the version an evaluation episode named, the version that served its call), every call."""
        named = {e: parse_versioned(m) for e, m in self.models.items()}
        return [(v[1], c.weight_version) for c in self.calls if (v := named.get(c.episode_id)) is not None]

    def version_of(self, session: str) -> int | None:
        episode = self.sessions.get(session)
        return next((c.weight_version for c in self.calls if c.episode_id == episode), None)


def _settings(data_dir: Path, gates: Path) -> StackSettings:
    from trainer.config import AlgorithmConfig

    return StackSettings(
        data_dir=data_dir,
        record_events=False,
        gateway_port=0,
        admin_token=TOKEN,
        releases="gated",
        release_gates=gates,
        trainer_release_every=1,
        trainer_mode="sync",
        trainer_batch_groups=2,
        trainer_torch_threads=1,
        trainer_algo=AlgorithmConfig(tis_cap=None),
    )


def _gates(tmp_path: Path, rule: dict[str, object], **extra: object) -> Path:
    tasks = tmp_path / "suite.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"eval-{i}", "input": {"question": q}}) + "\n"
            for i, q in enumerate(QUESTIONS)
        )
    )
    path = tmp_path / "gates.json"
    path.write_text(
        json.dumps({"tasks": "suite.jsonl", "agent": AGENT, "rules": [rule], "deadline_s": 60, **extra})
    )
    return path


async def _model() -> Path:
    from flywheel.cli.ops_up import TINY_CACHE, TINY_CORPUS
    from trainer.models.tiny import build_tiny

    return await asyncio.to_thread(build_tiny, TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)


async def _production_call(client: httpx.AsyncClient, key: str, session: str) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "X-Flywheel-Session": session},
        json={
            "model": "policy",
            "messages": [{"role": "user", "content": "What is 3 plus 4?"}],
            "max_tokens": 8,
        },
    )


async def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def _admin(client: httpx.AsyncClient) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


async def test_a_candidate_failing_its_gate_never_serves_production(tmp_path: Path) -> None:
    model = await _model()
    gates = _gates(tmp_path, {"metric": "score", "min": 1.01})  # rewards are at most 1: nothing passes
    _, key = KeyStore(tmp_path / "data" / "gateway" / "keys.json").create("acme")
    log = Log()
    task = Task(task_id="train", input={"question": "What is 2 plus 3?"})
    agent = AgentRef(kind=AgentKind.callable, spec=AGENT)
    stack = EmbeddedStack(
        _settings(tmp_path / "data", gates), model_dir=model, tasks=repeat(task), agent=agent
    )
    async with stack:
        assert stack.bus is not None and stack.engine is not None
        for topic in (EPISODES, CONTROL):
            await stack.bus.subscribe(topic, "releases-test", log.on, from_beginning=True)
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
            training = stack.start_training(3)  # the trainer's loop, in the background
            during = [await _production_call(client, key, f"s-during-{i}") for i in range(3)]
            await asyncio.wait_for(training, 300)
            last = max(e.version for e in log.of(VersionProposed))
            await _until(
                lambda: any(e.version == last for e in log.of(VersionEvaluated)), 240, "the last evaluation"
            )
            after = [await _production_call(client, key, f"s-after-{i}") for i in range(3)]
            assert all(r.status_code == 200 for r in during + after), [r.text for r in during + after]

            # the admin API refuses what cannot be done, in one line, and changes nothing
            admin = _admin(client)
            failed = await client.post(
                "/admin/versions/promote", json={"version": last, "by": "t"}, headers=admin
            )
            unknown = await client.post(
                "/admin/versions/promote", json={"version": 99, "by": "t"}, headers=admin
            )
            nothing = await client.post("/admin/versions/rollback", json={"by": "t"}, headers=admin)
            bad_body = await client.post("/admin/versions/promote", json={"version": -1}, headers=admin)
            book = (await client.get("/admin/versions", headers=admin)).json()
        latest = stack.engine.weight_version
    await _until(lambda: len(log.production_versions()) >= 6, 10, "the production calls' records")
    assert (failed.status_code, failed.json()["error"]["code"]) == (409, "release_refused"), failed.text
    assert f"version {last} failed its gates" in failed.json()["error"]["message"]
    assert (unknown.status_code, nothing.status_code, bad_body.status_code) == (404, 409, 422)
    assert "\n" not in failed.json()["error"]["message"] + nothing.json()["error"]["message"]

    evaluated = log.of(VersionEvaluated)
    assert evaluated and not any(e.passed for e in evaluated), evaluated
    assert all("< min 1.01" in e.rule and e.figures["episodes"] == len(QUESTIONS) for e in evaluated)
    # every evaluation call was served by the version its episode named (the slot), candidate or served
    pairs = log.evaluation_versions()
    assert pairs and all(named == served for named, served in pairs), pairs
    assert {named for named, _ in pairs} == {e.version for e in evaluated} | {0}
    assert not log.of(VersionPromoted)
    # two channels: the trainer's latest moved on, production stayed on version 0
    assert latest == 3 and any(c.weight_version > 0 for c in log.calls if c.episode_id not in log.production)
    assert log.production_versions() and set(log.production_versions()) == {0}
    policy = book["policies"][0]
    statuses = {v["version"]: v["status"] for v in policy["versions"]}
    assert policy["served"] == 0 and statuses[0] == "served"
    assert all(
        statuses[e.version] == "failed" for e in evaluated
    )  # a version superseded unevaluated: candidate
    print(f"gates refused versions {[e.version for e in evaluated]}: {evaluated[-1].rule}")


async def test_a_passing_candidate_is_promoted_rolled_back_under_load_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    model = await _model()
    gates = _gates(tmp_path, {"metric": "error_rate", "max": 0.5})
    _, key = KeyStore(tmp_path / "data" / "gateway" / "keys.json").create("acme")
    log = Log()
    task = Task(task_id="train", input={"question": "What is 2 plus 3?"})
    agent = AgentRef(kind=AgentKind.callable, spec=AGENT)
    stack = EmbeddedStack(
        _settings(tmp_path / "data", gates), model_dir=model, tasks=repeat(task), agent=agent
    )
    async with stack:
        assert stack.bus is not None
        for topic in (EPISODES, CONTROL):
            await stack.bus.subscribe(topic, "releases-test", log.on, from_beginning=True)
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
            await asyncio.wait_for(stack.start_training(2), 300)
            await _until(lambda: bool(log.of(VersionPromoted)), 240, "the gate's promotion")
            promoted = log.of(VersionPromoted)[0]
            assert promoted.decided_by == "gate" and promoted.previous == 0 and promoted.version >= 1
            first = await _production_call(client, key, "s-promoted")
            assert first.status_code == 200, first.text
            await _until(lambda: len(log.production_versions()) >= 1, 10, "the call's record")
            assert log.production_versions() == [promoted.version]

            # a rollback while production calls are in flight: every call answered, the next on version 0
            load = [asyncio.create_task(_production_call(client, key, f"s-load-{i}")) for i in range(12)]
            await asyncio.sleep(0.05)
            rolled = await client.post(
                "/admin/versions/rollback", json={"by": "t", "reason": "e2e"}, headers=_admin(client)
            )
            answers = await asyncio.gather(*load)
            after_rollback = await _production_call(client, key, "s-after-rollback")
            assert rolled.status_code == 200, rolled.text
            assert rolled.json()["release"]["served"] == 0
            assert [r.status_code for r in answers] == [200] * 12 and after_rollback.status_code == 200
            await _until(lambda: len(log.production_versions()) >= 14, 10, "every call's record")
            assert log.production_versions()[-1] == 0
            assert set(log.production_versions()[1:-1]) <= {0, promoted.version}

            again = await client.post(
                "/admin/versions/promote",
                json={"version": promoted.version, "by": "cli:alice"},
                headers=_admin(client),
            )
            assert again.status_code == 200 and again.json()["event"]["decided_by"] == "cli:alice"

    # every service restarts on the same data dir: production is served by the promoted version again
    # the trainer too: it resumes from its checkpoint and loads its latest weights into the engine
    restarted = EmbeddedStack(_settings(tmp_path / "data", gates), model_dir=model)
    async with restarted:
        assert restarted.bus is not None
        late = Log()
        for topic in (EPISODES, CONTROL):
            await restarted.bus.subscribe(topic, "releases-test", late.on, from_beginning=True)
        async with httpx.AsyncClient(base_url=restarted.gateway_url, timeout=60) as client:
            book = (await client.get("/admin/versions", headers=_admin(client))).json()
            answer = await _production_call(client, key, "s-restarted")
        assert restarted.engine is not None and restarted.trainer is not None
        restarted_latest = restarted.engine.weight_version
        assert answer.status_code == 200, answer.text
        await _until(lambda: len(late.production_versions()) >= 1, 10, "the call's record")
    assert book["policies"][0]["served"] == promoted.version
    assert late.production_versions() == [promoted.version]
    assert restarted_latest > promoted.version  # the latest the trainer resumed at is not what serves


async def _users(client: httpx.AsyncClient, key: str, log: Log, phase: str, like_canary: bool) -> int:
    """Production sessions of one call each, rated up when served by the side the users like, until the
    canary is decided; returns how many sessions it took."""
    decided = len(log.of(VersionPromoted)) + len(log.of(VersionRolledBack))
    for i in range(400):
        if len(log.of(VersionPromoted)) + len(log.of(VersionRolledBack)) > decided:
            return i
        session = f"s-{phase}-{i}"
        answer = await _production_call(client, key, session)
        assert answer.status_code == 200, answer.text
        await _until(lambda: log.version_of(session) is not None, 10, "the session's record")  # noqa: B023
        canary = [e for e in log.of(VersionCanary) if e.share > 0][-1].version
        up = (log.version_of(session) == canary) == like_canary
        rated = await client.post(
            "/v1/feedback",
            json={"session_id": session, "rating": 1 if up else -1},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert rated.status_code in (200, 202), rated.text
        await asyncio.sleep(0.02)
    pytest.fail(f"{phase}: the canary was not decided after 400 sessions")


async def test_a_canary_promotes_a_better_version_and_rolls_back_a_worse_one(tmp_path: Path) -> None:
    model = await _model()
    canary = {"share": 0.5, "min_sessions": 8, "alpha": 0.05, "tau": 0.5, "max_sessions": 300}
    gates = _gates(tmp_path, {"metric": "error_rate", "max": 0.5}, canary=canary)
    _, key = KeyStore(tmp_path / "data" / "gateway" / "keys.json").create("acme")
    log = Log()
    task = Task(task_id="train", input={"question": "What is 2 plus 3?"})
    agent = AgentRef(kind=AgentKind.callable, spec=AGENT)
    stack = EmbeddedStack(
        _settings(tmp_path / "data", gates), model_dir=model, tasks=repeat(task), agent=agent
    )
    async with stack:
        assert stack.bus is not None
        for topic in (EPISODES, CONTROL):
            await stack.bus.subscribe(topic, "releases-test", log.on, from_beginning=True)
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
            # version 1 passes its gate and goes to canary; its users like it better: promoted
            await asyncio.wait_for(stack.start_training(1), 300)
            await _until(lambda: bool(log.of(VersionCanary)), 240, "the first canary")
            better = await _users(client, key, log, "better", like_canary=True)
            # version 2 passes, goes to canary; its users like it worse: rolled back, version 1 stays
            await asyncio.wait_for(stack.start_training(1), 300)
            await _until(lambda: len(log.of(VersionCanary)) >= 2, 240, "the second canary")
            worse = await _users(client, key, log, "worse", like_canary=False)
            book = (await client.get("/admin/versions", headers=_admin(client))).json()
            bad_share = await client.post(
                "/admin/versions/canary", json={"version": 2, "share": 1.5, "by": "t"}, headers=_admin(client)
            )
    first, second = (e for e in log.of(VersionCanary) if e.share > 0)
    (promoted,) = log.of(VersionPromoted)
    (rolled,) = log.of(VersionRolledBack)
    assert (first.version, second.version) == (1, 2) and first.decided_by == "gate"
    assert promoted.version == 1 and promoted.decided_by == "canary" and "promote" in promoted.reason
    assert rolled.version == 2 and rolled.to == 1 and rolled.decided_by == "canary"
    for decision in (promoted, rolled):
        f = decision.figures
        assert f["likelihood_ratio"] >= f["threshold"] == 20.0
        assert min(f["canary_sessions"], f["served_sessions"]) >= 8
    assert promoted.figures["delta"] > 0 > rolled.figures["delta"]
    # sticky and split: both arms saw sessions, and every production call was recorded at v0, v1 or v2
    assert set(log.production_versions()) == {0, 1, 2}
    assert book["policies"][0]["served"] == 1 and book["policies"][0]["canary"] is None
    assert bad_share.status_code == 400 and "(0, 1)" in bad_share.json()["error"]["message"]
    print(
        f"canary promoted v1 after {better} sessions ({promoted.reason}); rolled back v2 after {worse} ({rolled.reason})"
    )


async def test_a_promoted_adapter_serves_production_from_an_engine_child(tmp_path: Path) -> None:
    """LoRA policies on a ``flywheel engine`` child (``engine_process``): the promoted adapter version is
    loaded into the child (with the child's own admin token) and serves production; the base after a
    rollback. Training rollouts stay on each adapter's latest."""
    from trainer.config import AlgorithmConfig, LoraOptions

    model = await _model()
    _, key = KeyStore(tmp_path / "data" / "gateway" / "keys.json").create("acme")
    settings = StackSettings(
        data_dir=tmp_path / "data",
        record_events=False,
        gateway_port=0,
        admin_token=TOKEN,
        engine_process=True,
        policies="writer,rewriter",
        releases="gated",
        trainer_release_every=1,
        trainer_mode="sync",
        trainer_batch_groups=2,
        trainer_torch_threads=1,
        trainer_algo=AlgorithmConfig(tis_cap=None),
        trainer_lora=LoraOptions(learning_rate=5e-2),
    )
    log = Log()
    task = Task(task_id="train", input={"question": "What is 2 plus 3?"})
    agent = AgentRef(kind=AgentKind.callable, spec=AGENT)
    stack = EmbeddedStack(settings, model_dir=model, tasks=repeat(task), agent=agent, group_size=4)

    async def production(client: httpx.AsyncClient, session: str) -> LLMCallRecorded:
        answer = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}", "X-Flywheel-Session": session},
            json={
                "model": "writer",
                "messages": [{"role": "user", "content": "What is 3 plus 4?"}],
                "max_tokens": 8,
            },
        )
        assert answer.status_code == 200, answer.text
        await _until(lambda: log.version_of(session) is not None, 10, "the call's record")
        return next(c for c in log.calls if c.episode_id == log.sessions[session])

    async with stack:
        assert stack.bus is not None and stack.engine_process is not None
        for topic in (EPISODES, CONTROL):
            await stack.bus.subscribe(topic, "releases-test", log.on, from_beginning=True)
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
            await asyncio.wait_for(stack.start_training(1), 300)
            await _until(
                lambda: any(e.adapter == "writer" for e in log.of(VersionProposed)), 30, "a writer candidate"
            )
            version = min(e.version for e in log.of(VersionProposed) if e.adapter == "writer")
            promoted = await client.post(
                "/admin/versions/promote",
                json={"version": version, "adapter": "writer", "by": "t"},
                headers=_admin(client),
            )
            assert promoted.status_code == 200, promoted.text
            on_it = await production(client, "s-promoted")
            rolled = await client.post(
                "/admin/versions/rollback", json={"adapter": "writer", "by": "t"}, headers=_admin(client)
            )
            assert rolled.status_code == 200, rolled.text
            after = await production(client, "s-after")
    assert (on_it.adapter, on_it.adapter_version) == ("writer", version)
    assert (after.adapter, after.adapter_version) == ("writer", 0)
