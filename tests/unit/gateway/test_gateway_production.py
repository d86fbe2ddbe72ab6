"""Production ingress: tenant keys, sessions as episodes, feedback, isolation between tenants."""

from __future__ import annotations

import pytest

from schemas import EpisodeFinished, EpisodeSource, EpisodeStarted, LLMCallRecorded, RewardReported
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(30)
MSGS = [{"role": "user", "content": "hi"}]


async def test_keys_sessions_feedback_and_isolation(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        _, key_a = h.keystore.create("acme")
        kid_b, key_b = h.keystore.create("globex")
        a = {"Authorization": f"Bearer {key_a}", "X-Flywheel-Session": "s1"}
        b = {"Authorization": f"Bearer {key_b}", "X-Flywheel-Session": "s1"}

        assert (await h.client.post("/v1/chat/completions", json={"messages": MSGS})).status_code == 401
        bad = await h.client.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={"Authorization": "Bearer no"}
        )
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"

        r1 = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=a)
        r2 = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=a)
        rb = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=b)
        assert r1.status_code == r2.status_code == rb.status_code == 200
        ep_a = r1.headers["X-Flywheel-Episode"]
        assert r2.headers["X-Flywheel-Episode"] == ep_a != rb.headers["X-Flywheel-Episode"]
        started = await h.events.wait_for(
            lambda e: isinstance(e, EpisodeStarted) and e.source == "production", count=2
        )
        assert {s.tenant for s in started} == {"acme", "globex"}
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
        assert {c.source for c in calls} == {EpisodeSource.production}
        assert all(key_a not in c.request and key_b not in c.request for c in calls)

        # the session comes from `user` when there is no header
        ru = await h.client.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "user": "u-7"},
            headers={"Authorization": f"Bearer {key_a}"},
        )
        assert ru.headers["X-Flywheel-Episode"] != ep_a

        # feedback: by call id (own tenant only) and by session
        call_id = r1.headers["X-Flywheel-Call"]
        fb = await h.client.post("/v1/feedback", json={"call_id": call_id, "rating": 1}, headers=a)
        assert fb.status_code == 200 and fb.json()["episode_id"] == ep_a
        assert (
            await h.client.post("/v1/feedback", json={"call_id": call_id, "rating": 1}, headers=b)
        ).status_code == 404
        fb = await h.client.post(
            "/v1/feedback", json={"session_id": "s1", "score": 0.5, "comment": "ok"}, headers=a
        )
        assert fb.status_code == 200
        rewards = await h.events.wait_for(lambda e: isinstance(e, RewardReported), count=2)
        assert {r.tenant for r in rewards} == {"acme"} and {r.origin for r in rewards} == {"feedback"}
        assert (await h.client.post("/v1/feedback", json={"rating": 1}, headers=a)).status_code == 422

        # ending a session: only the owner's, then a new call opens a new episode
        end = await h.client.post("/v1/sessions/s1/end", headers=a)
        assert end.status_code == 200 and end.json()["episode_id"] == ep_a
        assert (await h.client.post("/v1/sessions/s1/end", headers=a)).status_code == 404
        fin = await h.events.wait_for(lambda e: isinstance(e, EpisodeFinished))
        assert fin[0].tenant == "acme" and fin[0].source == "production"
        r3 = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=a)
        assert r3.headers["X-Flywheel-Episode"] != ep_a
        # a production episode is not reachable as a training episode URL
        assert (
            await h.client.post(f"/episodes/{ep_a}/v1/chat/completions", json={"messages": MSGS})
        ).status_code == 404

        assert h.keystore.revoke(kid_b) == 1
        h.keystore._checked = 0  # skip the 1 s re-read throttle
        assert (
            await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=b)
        ).status_code == 401
        assert (await h.client.get("/v1/models", headers=a)).json()["data"][0]["id"] == "policy"


def test_keystore_stores_only_hashes(tmp_path):
    from gateway.keys import KeyStore

    ks = KeyStore(tmp_path / "keys.json")
    _, key = ks.create("acme")
    text = (tmp_path / "keys.json").read_text()
    secret = key.split("_", 2)[2]  # fw_<key id>_<secret>; the secret itself may hold "_"
    assert key not in text and secret not in text
    assert KeyStore(tmp_path / "keys.json").tenant_for(key) == "acme"
    assert ks.tenant_for(key + "x") is None
    with pytest.raises(ValueError):
        ks.create("bad tenant!")


async def test_feedback_after_a_session_ended_is_accepted_in_its_window_then_409(tmp_path):
    async with GatewayHarness(tmp_path, feedback_window_s=30.0) as h:
        _, key = h.keystore.create("acme")
        auth = {"Authorization": f"Bearer {key}"}
        r = await h.client.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={**auth, "X-Flywheel-Session": "s9"}
        )
        ep = r.headers["X-Flywheel-Episode"]
        live = await h.client.post("/v1/feedback", json={"session_id": "s9", "rating": 1}, headers=auth)
        assert live.status_code == 200 and live.json()["session_open"] is True
        assert (await h.client.post("/v1/sessions/s9/end", headers=auth)).status_code == 200
        # ended: accepted, and the reward service re-scores the session with it
        for body in (
            {"session_id": "s9", "rating": -1},
            {"call_id": r.headers["X-Flywheel-Call"], "rating": 1},
        ):
            late = await h.client.post("/v1/feedback", json=body, headers=auth)
            assert late.status_code == 200, late.text
            assert late.json()["session_open"] is False and late.json()["rescore"] is True
        rewards = await h.events.wait_for(lambda e: isinstance(e, RewardReported), count=3)
        assert {e.episode_id for e in rewards} == {ep}
        # past the window: a 409 in OpenAI's format, and nothing published
        h.gateway.settings.feedback_window_s = 1e-6
        closed = await h.client.post("/v1/feedback", json={"session_id": "s9", "rating": 1}, headers=auth)
        assert closed.status_code == 409
        err = closed.json()["error"]
        assert err["code"] == "feedback_window_closed" and err["type"] == "invalid_request_error"
        assert "ended" in err["message"] and "FLYWHEEL_FEEDBACK_WINDOW_S" in err["message"]
        # the gateway no longer remembers when it ended (its bounded memory moved on): 409, never a 200
        h.gateway.episodes._finished.clear()
        gone = await h.client.post("/v1/feedback", json={"session_id": "s9", "rating": 1}, headers=auth)
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "session_expired"
        assert len(h.events.of(RewardReported)) == 3
        unknown = await h.client.post("/v1/feedback", json={"session_id": "nope", "rating": 1}, headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "session_not_found"
