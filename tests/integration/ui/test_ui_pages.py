"""The web view's pages against a real embedded ClickHouse (chdb) holding a known recorded run.

What the browser tests (tests/e2e/test_ui_browser.py) show with real traffic, checked here page by
page and value by value, plus every bad input: a malformed filter, an unknown episode or page, a
missing sign-in each get a clear HTML page with a 4xx, never a 500.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas as s
from flywheel.ui.app import create_ui_app
from flywheel.ui.params import FIELDS
from infra.eventlog.store import ChdbStore
from tests.integration.ops.synthetic import T0, Run, synthetic_run

pytestmark = pytest.mark.timeout(120)

TOKEN = "ui-test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EVIL = "<script>alert('x')</script>"


def _extra_events(run: Run) -> list[s.AnyEvent]:
    """Trainer steps, a production session with feedback, a per-call reward, an episode with markup."""
    at = T0 + timedelta(minutes=20)
    steps = [
        s.TrainerStepCompleted(
            emitted_at=at + timedelta(seconds=i),
            step=i,
            version=i,
            metrics=s.StepMetrics.model_validate(
                {
                    "reward": 0.1 * i,
                    "success": 0.2 * i,
                    "staleness_mean": 0.5,
                    "tis_mean": 0.9 + i / 100,
                    "excluded_no_signal": float(i),
                    **({"excluded_no_reward": 2.0} if i == 2 else {}),
                }
            ),
            samples={s.EpisodeSource.live: 4 * i, s.EpisodeSource.production: 1},
        )
        for i in (1, 2, 3)
    ]
    prod = s.new_episode_id()
    production = [
        s.EpisodeScored(
            emitted_at=at, episode_id=prod, group_id=s.new_group_id(), tenant="beta",
            source=s.EpisodeSource.production, reward=1.0, num_calls=1, score_note="the user liked it",
        ),
        s.RewardReported(
            emitted_at=at, episode_id=prod, value=1.0, rating=1, origin=s.RewardOrigin.feedback,
            message="great answer", tenant="beta",
        ),
    ]  # fmt: skip
    first = run.scored[0]
    per_call = s.RewardReported(emitted_at=at, episode_id=first.episode_id, value=0.25, call_seq=1)
    evil = s.new_episode_id()
    markup = [
        s.EpisodeStarted(emitted_at=at, episode_id=evil, task=s.Task(task_id=EVIL, input={}), tenant=EVIL),
        s.LLMCallRecorded(
            emitted_at=at, episode_id=evil, call_seq=0, call_id="evil-0",
            request='{"messages": [{"role": "user", "content": "' + EVIL + '"}]}',
            choices=[s.CallChoice(index=0, text=EVIL, token_ids=[1], logprobs=[-0.1])],
        ),
    ]  # fmt: skip
    return [*steps, *production, per_call, *markup]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChdbStore, Run]]:
    store = ChdbStore(Path(tmp_path_factory.mktemp("ui")) / "chdb")
    store.migrate()
    run = synthetic_run(groups=2, size=4, tenant="acme")
    store.insert(run.events + _extra_events(run))
    try:
        yield store, run
    finally:
        store.close()


@pytest.fixture(scope="module")
def client(recorded: tuple[ChdbStore, Run]) -> Iterator[TestClient]:
    with TestClient(create_ui_app(recorded[0], TOKEN)) as c:
        yield c


def _listed(html: str) -> list[str]:
    return re.findall(r'<tr class="episode" data-episode="([^"]+)"', html)


def test_pages_need_the_admin_token_and_the_form_sets_a_cookie(client: TestClient) -> None:
    for path in ("/ui/", "/ui/training", "/ui/episodes/abc"):
        r = client.get(path)
        assert r.status_code == 401 and 'name="token"' in r.text, path
    assert client.get("/ui/api/training").status_code == 401
    assert client.post("/ui/login", data={"token": "wrong"}).status_code == 401
    r = client.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower()
    assert TOKEN not in r.headers["set-cookie"]  # the cookie is an HMAC under the token, not the token
    assert client.get("/ui/").status_code == 200  # the cookie signs the client in
    client.cookies.clear()
    assert client.get("/ui/static/chart.umd.min.js").status_code == 200  # the library needs no sign-in


def test_the_list_shows_every_episode_and_filters_narrow_it(
    client: TestClient, recorded: tuple[ChdbStore, Run]
) -> None:
    _, run = recorded
    all_ids = set(_listed(client.get("/ui/?page_size=500", headers=AUTH).text))
    assert {e.episode_id for e in run.scored} <= all_ids
    acme = set(_listed(client.get("/ui/?tenant=acme&page_size=500", headers=AUTH).text))
    assert acme == {e.episode_id for e in run.scored}
    production = _listed(client.get("/ui/?source=production", headers=AUTH).text)
    assert len(production) == 1
    rewarded = set(_listed(client.get("/ui/?tenant=acme&reward_min=1&page_size=500", headers=AUTH).text))
    assert rewarded == {e.episode_id for e in run.scored if e.reward is not None and e.reward >= 1}
    assert rewarded < acme
    by_task = set(_listed(client.get("/ui/?task=calc-1&page_size=500", headers=AUTH).text))
    assert by_task == {e.episode_id for e in run.scored if e.task_id == "calc-1"}
    versions = set(_listed(client.get("/ui/?version_min=3&page_size=500", headers=AUTH).text))
    assert versions and versions < acme
    # pages: disjoint, in order, with links to each other
    first = client.get("/ui/?tenant=acme&page_size=4", headers=AUTH).text
    second = client.get("/ui/?tenant=acme&page_size=4&page=2", headers=AUTH).text
    assert len(_listed(first)) == 4 and 'id="next"' in first and 'id="prev"' not in first
    assert not set(_listed(first)) & set(_listed(second)) and 'id="prev"' in second
    rows = client.get("/ui/episodes/rows?tenant=acme&page_size=4", headers=AUTH).text
    assert _listed(rows) == _listed(first)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("reward_min=abc", "reward_min must be a number"),
        ("page=-1", "page must be between 1"),
        ("page=abc", "page must be a whole number"),
        ("page_size=0", "page_size must be between 1"),
        ("version_min=-2", "version_min must be between 0"),
        ("reward_min=2&reward_max=1", "min_reward must not exceed max_reward"),
        ("source=elsewhere", "source must be one of live, production, replay"),
        ("since=last%20tuesday", "since: not a time"),
        ("reward_max=nan", "reward_max must be a finite number"),
    ],
)
def test_a_malformed_filter_is_a_400_page_that_says_what_is_wrong(
    client: TestClient, query: str, words: str
) -> None:
    for path in ("/ui/", "/ui/episodes/rows"):
        r = client.get(f"{path}?{query}", headers=AUTH)
        assert r.status_code == 400 and r.headers["content-type"].startswith("text/html"), (path, r.text)
        assert words in r.text.replace("&#x27;", "'"), r.text


@pytest.mark.parametrize("value", ["\\", "a\\b", "ends\\", "\\N", "'", "a'b", "a\tb", "a\nb", "a\\tb"])
def test_a_filter_with_a_backslash_quote_tab_or_newline_is_searched_literally(
    client: TestClient, value: str
) -> None:
    # chdb reads a bound value as escaped text: an unescaped backslash was refused (a 503 page).
    for path in ("/ui/", "/ui/episodes/rows"):
        r = client.get(path, params={"tenant": value}, headers=AUTH)
        assert r.status_code == 200 and "no episodes match" in r.text, (path, value, r.text[:300])
        r = client.get(path, params={"task": value}, headers=AUTH)  # the markup episode's task has a quote
        assert r.status_code == 200, (path, value, r.text[:300])


def test_unknown_episodes_and_pages_are_404_pages(client: TestClient) -> None:
    r = client.get("/ui/episodes/" + "f" * 32, headers=AUTH)
    assert (
        r.status_code == 404 and "no episode" in r.text and r.headers["content-type"].startswith("text/html")
    )
    assert client.get("/ui/episodes/" + "x" * 65, headers=AUTH).status_code == 400
    assert client.get("/ui/episodes/a%20b", headers=AUTH).status_code == 400
    assert client.get("/ui/nowhere/at/all", headers=AUTH).status_code == 404
    assert client.get("/ui/static/secrets.txt", headers=AUTH).status_code == 404
    assert client.get("/ui/training?bucket=year", headers=AUTH).status_code == 400
    assert client.get("/ui/api/training?bucket=year", headers=AUTH).status_code == 400


def test_an_episode_shows_its_calls_tokens_logprobs_rewards_and_merges(
    client: TestClient, recorded: tuple[ChdbStore, Run]
) -> None:
    _, run = recorded
    episode = run.scored[0]
    html = client.get(f"/ui/episodes/{episode.episode_id}", headers=AUTH).text
    calls = [c for c in run.calls if c.episode_id == episode.episode_id]
    sections = html.split('<section class="call"')[1:]
    assert len(sections) == len(calls) == 2
    for section, call in zip(sections, calls, strict=True):
        ids = [int(x) for x in re.findall(r'class="tok" data-id="(\d+)"', section)]
        logprobs = [float(x) for x in re.findall(r'data-logprob="([^"]*)"', section)]
        assert ids == call.choices[0].token_ids
        assert logprobs == pytest.approx(call.choices[0].logprobs, abs=1e-6)
        assert f"weights v{call.weight_version}" in section
    assert "<b>calc</b>" in sections[1]  # the tool call of the second call, by name
    assert "reward 0.25 (agent)" in sections[1]  # the per-call reward
    assert "trajectory 0" in sections[0] and "trajectory 1" in sections[1]
    assert 'id="trajectories"' in html and f"{episode.reward_source}" in html


def test_recorded_text_is_escaped(client: TestClient) -> None:
    html = client.get("/ui/?page_size=500", headers=AUTH).text
    assert EVIL not in html and "&lt;script&gt;" in html
    evil = _listed(client.get("/ui/", params={"tenant": EVIL}, headers=AUTH).text)
    assert len(evil) == 1
    page = client.get(f"/ui/episodes/{evil[0]}", headers=AUTH).text
    assert EVIL not in page and page.count("&lt;script&gt;") >= 2  # the message and the answer


def test_the_training_data_has_every_step_and_the_feedback_per_tenant(client: TestClient) -> None:
    data = client.get("/ui/api/training", headers=AUTH).json()
    charts = data["charts"]
    assert charts["reward"]["labels"] == [1, 2, 3]
    assert charts["reward"]["series"]["reward"] == pytest.approx([0.1, 0.2, 0.3])
    assert charts["importance"]["series"]["TIS mean"] == pytest.approx([0.91, 0.92, 0.93])
    assert charts["samples"]["series"]["live"] == [4, 8, 12]
    assert charts["samples"]["series"]["production"] == [1, 1, 1]
    # what each step's batch left out, per reason (a reason a step did not report is 0 there)
    assert charts["excluded"]["series"] == {"no_reward": [0.0, 2.0, 0.0], "no_signal": [1.0, 2.0, 3.0]}
    assert charts["versions"]["labels"] == [0, 1, 2, 3]  # the synthetic run's serving versions
    assert charts["tenants"]["labels"] == ["beta"] and charts["tenants"]["series"]["feedback rate"] == [1.0]
    page = client.get("/ui/training", headers=AUTH).text
    assert re.findall(r'<tr class="step" data-step="(\d+)"', page) == ["3", "2", "1"]
    assert 'id="chart-reward"' in page and "chart.umd.min.js" in page
    assert 'id="chart-excluded"' in page and "no_reward 2, no_signal 2" in page


_VALUES = st.one_of(
    st.text(max_size=20),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "0", "-1", "1e400", "live", "ok", "now", "1h", "%", "_", "\\", "'", "2026-12-01"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.dictionaries(st.sampled_from([*FIELDS, "page", "bucket"]), _VALUES, max_size=5))
def test_any_query_string_is_a_page_or_a_400_never_a_500(client: TestClient, query: dict[str, str]) -> None:
    for path in ("/ui/", "/ui/episodes/rows", "/ui/training"):
        r = client.get(path, params=query, headers=AUTH)
        assert r.status_code in (200, 400), (path, query, r.status_code, r.text[:300])
        assert r.headers["content-type"].startswith("text/html")


def test_sign_in_reads_a_bounded_body_and_is_throttled_per_address(recorded: tuple[ChdbStore, Run]) -> None:
    """An unauthenticated sign-in costs at most MAX_FORM bytes read; ten wrong tokens from one address
    in a minute, and the eleventh try (even with the right token) is a 429 with Retry-After."""
    from flywheel.ui.auth import MAX_FORM, SignInThrottle

    store, _ = recorded
    with TestClient(create_ui_app(store, TOKEN)) as fresh:
        big = fresh.post(
            "/ui/login",
            content=b"token=" + b"x" * (MAX_FORM + 1),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert big.status_code == 413 and "too large" in big.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: the stream is cut at the limit
            yield b"token="
            for _ in range(1000):
                yield b"x" * 1024

        streamed = fresh.post(
            "/ui/login", content=chunks(), headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert streamed.status_code == 413
        for _ in range(10):
            assert fresh.post("/ui/login", data={"token": "wrong"}).status_code == 401
        throttled = fresh.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        assert "too many failed sign-ins" in throttled.text
    throttle = SignInThrottle(limit=2, window_s=60.0, max_clients=2)
    throttle.failed("a", now=0.0)
    throttle.failed("a", now=1.0)
    assert throttle.retry_after("a", now=2.0) == pytest.approx(58.0)
    assert throttle.retry_after("a", now=61.5) is None  # the window passed
    for client in ("b", "c", "d"):
        throttle.failed(client, now=62.0)
    assert len(throttle._failures) == 2  # bounded: the oldest address forgotten
