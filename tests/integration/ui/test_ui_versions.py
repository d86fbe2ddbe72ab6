"""The web view's versions page (``/ui/versions``) against a real embedded ClickHouse (chdb).

First the empty log ("no release events yet"), then a release history written as the recorder writes
it: candidates proposed and evaluated, a promotion, a rollback, a pin and an unpin, an adapter's
candidate. The page lists them newest first with their policy, version, who decided, the gate's
verdict and rule, and their figures; every malformed filter is a 400 page that says what is wrong.
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
from infra.eventlog.store import ChdbStore
from tests.integration.ops.synthetic import T0

pytestmark = pytest.mark.timeout(120)

TOKEN = "ui-test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EVIL = "<script>alert('x')</script>"


def _history() -> list[s.AnyEvent]:
    """Ten release events one minute apart, oldest first."""
    events: list[s.AnyEvent] = [
        s.VersionProposed(version=1, checkpoint_path="/ckpt/v1", step=10, producer="trainer"),
        s.VersionEvaluated(version=1, passed=True, rule="all", figures={"score": 0.81}, producer="gate"),
        s.VersionProposed(version=2, checkpoint_path="/ckpt/v2", step=20, producer="trainer"),
        s.VersionEvaluated(
            version=2,
            passed=False,
            rule="score 0.3 < 0.5",
            figures={"score": 0.3},
            served_figures={"score": 0.81},
            producer="gate",
        ),
        s.VersionPromoted(
            version=1, previous=0, decided_by="cli:alice", reason="gates passed", figures={"score": 0.81}
        ),
        s.VersionPromoted(version=3, previous=1, decided_by="rule:auto", figures={"score": 0.9, "kl": 0.02}),
        s.VersionRolledBack(
            version=3, to=1, decided_by="cli:bob", reason=EVIL, figures={"thumbs_down_rate": 0.4}
        ),
        s.VersionPinned(version=1, decided_by="cli:alice", reason="freeze"),
        s.VersionPinned(version=None, decided_by="cli:alice"),
        s.VersionProposed(adapter="terse", version=1, checkpoint_path="/ckpt/terse/v1", producer="trainer"),
    ]
    return [e.model_copy(update={"emitted_at": T0 + timedelta(minutes=i)}) for i, e in enumerate(events)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    store = ChdbStore(Path(tmp_path_factory.mktemp("ui-versions")) / "chdb")
    store.migrate()
    try:
        yield store
    finally:
        store.close()


def _rows(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<tr class="release" data-type="([^"]+)" data-policy="([^"]+)"', html)


def _row(html: str, kind: str) -> str:
    return next(row for row in html.split('<tr class="release"')[1:] if f'data-type="{kind}"' in row)


def test_the_page_is_empty_then_lists_each_release_event_newest_first(store: ChdbStore) -> None:
    with TestClient(create_ui_app(store, TOKEN)) as client:
        assert client.get("/ui/versions").status_code == 401  # signed out: the sign-in form
        empty = client.get("/ui/versions", headers=AUTH)
        assert (
            empty.status_code == 200 and 'id="empty"' in empty.text and "no release events yet" in empty.text
        )
        assert '<a href="/ui/versions" class="on">Versions</a>' in empty.text

        history = _history()
        store.insert([*history, *history[:2]])  # an event recorded twice is listed once
        html = client.get("/ui/versions", headers=AUTH).text
        assert "no release events" not in html
        assert _rows(html) == [
            ("proposed", "terse"), ("pinned", "policy"), ("pinned", "policy"), ("rolled_back", "policy"),
            ("promoted", "policy"), ("promoted", "policy"), ("evaluated", "policy"), ("proposed", "policy"),
            ("evaluated", "policy"), ("proposed", "policy"),
        ]  # fmt: skip
        rolled_back = _row(html, "rolled_back")
        assert "3 → 1" in rolled_back and "cli:bob" in rolled_back and "thumbs_down_rate 0.4" in rolled_back
        assert EVIL not in html and "&lt;script&gt;" in rolled_back  # the reason, escaped
        promoted = html.split('data-type="promoted"')[1:]
        assert "1 → 3" in promoted[0] and "rule:auto" in promoted[0] and "kl 0.02, score 0.9" in promoted[0]
        assert "0 → 1" in promoted[1] and "cli:alice" in promoted[1] and "gates passed" in promoted[1]
        failed = html.split('data-type="evaluated"')[1]
        assert "failed" in failed and "score 0.3 &lt; 0.5" in failed and "served: score 0.81" in failed
        assert "step 20" in html.split('data-type="proposed"')[2]  # a candidate's figure: its step
        assert T0.strftime("%Y-%m-%d %H:") in html and ">off<" in _row(html, "pinned")


def test_filters_narrow_the_list_and_malformed_ones_are_400_pages(store: ChdbStore) -> None:
    if not store.counts().by_type.get("version_promoted"):
        store.insert(_history())
    with TestClient(create_ui_app(store, TOKEN)) as client:
        promoted = client.get("/ui/versions?type=promoted", headers=AUTH).text
        assert _rows(promoted) == [("promoted", "policy")] * 2
        assert _rows(client.get("/ui/versions?policy=terse", headers=AUTH).text) == [("proposed", "terse")]
        assert len(_rows(client.get("/ui/versions?limit=3", headers=AUTH).text)) == 3
        none = client.get("/ui/versions?type=pinned&policy=terse", headers=AUTH)
        assert none.status_code == 200 and "no release events match" in none.text
        for query, words in (
            ("type=deleted", "type must be one of proposed, evaluated, promoted, rolled_back, pinned"),
            ("policy=x'%20OR%201=1", "policy must be a model or adapter name"),
            ("limit=abc", "limit must be a whole number"),
            ("limit=0", "limit must be between 1 and 2000"),
        ):
            r = client.get(f"/ui/versions?{query}", headers=AUTH)
            assert r.status_code == 400 and r.headers["content-type"].startswith("text/html"), r.text
            assert words in r.text.replace("&#x27;", "'"), r.text


_VALUES = st.one_of(
    st.text(max_size=20),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(
        ["", "0", "1", "2000", "2001", "promoted", "rolled_back", "terse", "'", "%", "\\", "a b"]
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.dictionaries(st.sampled_from(["type", "policy", "limit"]), _VALUES, max_size=3))
def test_any_query_string_is_a_page_or_a_400_never_a_500(store: ChdbStore, query: dict[str, str]) -> None:
    with TestClient(create_ui_app(store, TOKEN)) as client:
        r = client.get("/ui/versions", params=query, headers=AUTH)
    assert r.status_code in (200, 400), (query, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html")


def test_every_answer_of_the_view_carries_the_security_headers(store: ChdbStore) -> None:
    """Pages, the sign-in form, error pages, JSON and static files: scripts only from the view's own files,
    no framing, no sniffing, no referrer; nothing but the static files may be cached."""
    with TestClient(create_ui_app(store, TOKEN)) as client:
        answers = {
            "signed out": client.get("/ui/versions"),
            "page": client.get("/ui/versions", headers=AUTH),
            "bad filter": client.get("/ui/versions?limit=x", headers=AUTH),
            "unknown page": client.get("/ui/nothing-here", headers=AUTH),
            "json": client.get("/ui/api/training", headers=AUTH),
            "static": client.get("/ui/static/ui.js"),
        }
    for what, answer in answers.items():
        csp = answer.headers.get("content-security-policy", "")
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp, (what, answer.headers)
        assert answer.headers.get("x-content-type-options") == "nosniff", what
        assert answer.headers.get("x-frame-options") == "DENY", what
        assert answer.headers.get("referrer-policy") == "no-referrer", what
        assert (answer.headers.get("cache-control") == "no-store") == (what != "static"), (
            what,
            answer.headers,
        )
