"""Recorded token ids are replayed only into the tokenizer that made them (issue 50).

``flywheel up --tiny`` serves the toy model; one production session goes through the gateway. Its
recorded call carries the fingerprint of the toy model's tokenizer (``LLMCallRecorded.tokenizer``, set by
the stack from its model), as does the scored episode's transition. ``flywheel replay --tokenizer``
pointed at the toy model accepts the episode; pointed at another tokenizer it refuses in one line, and
nothing is sent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from tests.e2e.test_production_training import FLYWHEEL, _cli, _port, _wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "tokenizer-e2e-admin-token-0123456789abcdef"


def _query(env: dict[str, str], url: str, sql: str) -> list[list[object]]:
    r = _cli(env, "query", "--url", url, "--json", sql)
    assert r.returncode == 0, r.stderr
    rows: list[list[object]] = json.loads(r.stdout)["rows"]
    return rows


def test_a_replay_into_another_tokenizer_is_refused(tmp_path: Path) -> None:
    from openai import OpenAI

    from flywheel.assembly import TINY_CACHE

    port = _port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_DATA_DIR": str(data)})
    other = tmp_path / "other-tokenizer"
    vocab = {"<unk>": 0, "a": 1, "b": 2}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>"))).save_pretrained(
        str(other)
    )
    log_path = tmp_path / "up.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [FLYWHEEL, "up", "--tiny", "--port", str(port), "--data-dir", str(data)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_ready(proc, url, log_path)
        ours = _cli(env, "model", "fingerprint", str(TINY_CACHE))
        assert ours.returncode == 0, ours.stderr
        fingerprint = ours.stdout.strip()
        key = _cli(env, "keys", "create", "--tenant", "acme").stdout.strip()
        with (
            OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60) as client,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        ):
            client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                max_tokens=8,
                extra_headers={"X-Flywheel-Session": "s-1"},
            )
            assert http.post("/v1/feedback", json={"session_id": "s-1", "rating": 1}).status_code == 200
            assert http.post("/v1/sessions/s-1/end").status_code == 200
        calls: list[list[object]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not calls:
            calls = _query(
                env,
                url,
                "SELECT c.t, JSONExtractString(JSONExtractArrayRaw(e.payload, 'transitions')[1], 'tokenizer') "
                "FROM flywheel.events e JOIN (SELECT episode_id, JSONExtractString(payload, 'tokenizer') t "
                "FROM flywheel.events WHERE type = 'llm_call_recorded') c USING episode_id "
                "WHERE e.type = 'episode_scored' AND e.source = 'production' AND c.t != ''",
            )
            time.sleep(0.5)
        assert calls, "no scored production episode with a recorded tokenizer"
        assert calls[0] == [fingerprint, fingerprint], (calls, fingerprint)  # the call's and the transition's

        common = ["replay", "--url", url, "--dry-run", "--source", "production", "--json"]
        same = _cli(env, *common, "--tokenizer", str(TINY_CACHE))
        assert same.returncode == 0, same.stderr
        assert json.loads(same.stdout)["selected"] == 1
        refused = _cli(env, *common, "--tokenizer", str(other))
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        line = refused.stderr.strip()
        assert "\n" not in line and "recorded with tokenizer" in line and fingerprint in line, line
        assert "not the target's" in line
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
