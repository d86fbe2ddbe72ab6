"""docs/usage.md's "Production traffic" section, followed literally.

The section's shell block is run line by line as a user would: ``flywheel keys create --tenant acme``
through the real CLI (its printed key is the one used), the ``export`` line's variables set to this
gateway's URL and that key, and ``python support_agent.py`` runs the section's Python block, unchanged,
as its own process (an OpenAI Agents SDK app) against a gateway on loopback (uvicorn, in-process bus,
fake engine). Then the recorded events must show what the section promises: both calls in the
session's episode (named by ``X-Flywheel-Session``), the feedback by call id (the id the app read from
``X-Flywheel-Call``) and by session, the session ended; after the end a rating by call id is still a
200 that re-scores the session, and an unknown call id is a 404. Code blocks are found the way
``tests/unit/test_docs.py`` finds them (its fence pattern, the page's own headings).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas import EpisodeFinished, EpisodeStarted, LLMCallRecorded, RewardOrigin, RewardReported
from tests.fakes.gateway_harness import BackgroundGateway
from tests.unit.test_docs import _FENCE, ROOT

pytestmark = pytest.mark.timeout(180)

SECTION = "## Production traffic"


def code_blocks(page: Path, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, text) under ``heading``, up to the next heading of its level."""
    level = heading.split(" ", 1)[0] + " "
    blocks: list[tuple[str, str]] = []
    inside = False
    fence: list[str] | None = None
    language = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        if fence is not None:
            if _FENCE.match(line.lstrip()):
                blocks.append((language, "\n".join(fence) + "\n"))
                fence = None
            else:
                fence.append(line)
            continue
        if line.startswith(level):
            inside = line.strip() == heading
            continue
        if inside and _FENCE.match(line.lstrip()):
            language, fence = line.lstrip()[3:].strip(), []
    return blocks


def test_code_blocks_are_found_under_their_heading_only(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "## Other\n\n```bash\nno\n```\n\n## Production traffic\n\ntext\n\n```bash\na\n```\n\n"
        "### Sub\n\n```python\n## not a heading\nb\n```\n\n## Next\n\n```python\nno\n```\n"
    )
    assert code_blocks(page, SECTION) == [("bash", "a\n"), ("python", "## not a heading\nb\n")]


def _env() -> dict[str, str]:
    """This process's environment without Flywheel's, OpenAI's or a proxy's variables."""
    dropped = ("FLYWHEEL_", "OPENAI_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    return {k: v for k, v in os.environ.items() if not k.upper().startswith(dropped)}


def _create_key(args: list[str], data_dir: Path) -> str:
    """``flywheel keys create …`` through the real CLI (typer's runner); returns the key it printed."""
    from typer.testing import CliRunner

    from flywheel.cli.main import app

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("FLYWHEEL_", "OPENAI_"))}
    env["FLYWHEEL_DATA_DIR"] = str(data_dir)
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.stderr
    key = result.stdout.strip()
    assert key.startswith("fw_"), result.stdout
    return key


def test_the_production_section_runs_as_written(tmp_path: Path) -> None:
    blocks = code_blocks(ROOT / "docs" / "usage.md", SECTION)
    assert [language for language, _ in blocks] == ["bash", "python"], blocks
    shell, program = blocks[0][1], blocks[1][1]
    app = tmp_path / "app"
    app.mkdir()
    env = _env()
    key = ""
    ran = None
    with BackgroundGateway(tmp_path) as gw:
        for line in shell.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[:3] == ["flywheel", "keys", "create"]:
                key = _create_key(words[1:], tmp_path)  # the gateway's key store is under tmp_path
            elif words[0] == "export":
                names = dict(word.split("=", 1) for word in words[1:])
                assert set(names) == {"OPENAI_BASE_URL", "OPENAI_API_KEY"}, names
                assert names["OPENAI_BASE_URL"].endswith("/v1"), names
                env.update(OPENAI_BASE_URL=f"{gw.url}/v1", OPENAI_API_KEY=key)
            elif words[0] == "python":
                (app / words[1]).write_text(program, encoding="utf-8")
                ran = subprocess.run(
                    [sys.executable, words[1]], cwd=app, env=env, capture_output=True, text=True, timeout=90
                )
            else:
                pytest.fail(f"this test does not know how to follow the documented line {line!r}")
        assert key and ran is not None, shell
        assert ran.returncode == 0, ran.stderr[-4000:]
        assert ran.stdout.strip(), "the app printed no answer"
        _check_recorded(gw, key)


def _check_recorded(gw: BackgroundGateway, key: str) -> None:
    events = gw.h.events

    def one(kind: type, within_s: float = 10.0, count: int = 1, **fields: object) -> list[Any]:
        def matches(e: object) -> bool:
            return isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())

        return list(gw.run(events.wait_for(matches, within_s, count), within_s + 5))

    (started,) = one(EpisodeStarted, session_id="user-42", tenant="acme")
    episode = started.episode_id
    calls = sorted(one(LLMCallRecorded, count=2, episode_id=episode), key=lambda c: c.call_seq)
    assert len(calls) == 2 and calls[0].call_id != calls[1].call_id, calls
    feedback = one(RewardReported, count=2, episode_id=episode, origin=RewardOrigin.feedback)
    by_call = [f for f in feedback if f.call_id is not None]
    by_session = [f for f in feedback if f.call_id is None]
    assert [(f.call_id, f.call_seq, f.rating) for f in by_call] == [(calls[0].call_id, 0, 1)]
    assert [(f.value, f.message) for f in by_session] == [(0.8, "solved")]
    one(EpisodeFinished, episode_id=episode)
    assert gw.h.gateway.sessions.episodes.session("acme", "user-42") is None  # ended, not open

    auth = {"Authorization": f"Bearer {key}"}
    late = httpx.post(f"{gw.url}/v1/feedback", headers=auth, json={"call_id": calls[1].call_id, "rating": -1})
    assert late.status_code == 200, late.text
    assert late.json()["episode_id"] == episode and late.json()["rescore"] is True
    unknown = httpx.post(f"{gw.url}/v1/feedback", headers=auth, json={"call_id": "no-such-call", "rating": 1})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "call_not_found", unknown.text
    again = httpx.post(f"{gw.url}/v1/sessions/user-42/end", headers=auth)
    assert again.status_code == 404, again.text  # no longer open
    stranger = httpx.post(f"{gw.url}/v1/feedback", json={"session_id": "user-42", "rating": 1})
    assert stranger.status_code == 401, stranger.text
