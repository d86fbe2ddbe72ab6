"""The event log's admin API (what CLI reads use while a process holds chdb) and the HTTP reader."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from infra.eventlog.api import create_eventlog_router
from infra.eventlog.client import HttpEventLogReader
from infra.eventlog.errors import EventLogError, EventLogQueryError, ReadOnlyQueryError
from infra.eventlog.models import CallFilter, EpisodeFilter
from infra.eventlog.store import ChdbStore
from tests.integration.eventlog.helpers import history

pytestmark = pytest.mark.timeout(60)
TOKEN = "test-admin-token"
EP1 = f"{1:032x}"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    st = ChdbStore(tmp_path_factory.mktemp("api") / "chdb", database="evapi")
    try:
        st.migrate()
        st.insert(history())
        yield st
    finally:
        st.close()


@pytest.fixture(scope="module")
def client(store: ChdbStore) -> Iterator[TestClient]:
    app = FastAPI()
    app.include_router(create_eventlog_router(store, TOKEN))
    with TestClient(app) as c:
        yield c


@pytest.fixture
def reader(client: TestClient) -> HttpEventLogReader:
    return HttpEventLogReader("http://testserver", TOKEN, client=client)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/admin/eventlog/query", {"sql": "SELECT 1"}),
        ("POST", "/admin/eventlog/episodes", {}),
        ("GET", f"/admin/eventlog/episodes/{EP1}/events", None),
        ("GET", "/admin/eventlog/stats", None),
        ("GET", "/admin/eventlog/counts", None),
        ("POST", "/admin/eventlog/scored", {}),
        ("POST", "/admin/eventlog/calls", {}),
    ],
)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_every_route_needs_the_admin_token(
    client: TestClient, method: str, path: str, body: object, headers: dict[str, str]
) -> None:
    response = client.request(method, path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_admin_token"


def test_query_and_refusals(client: TestClient) -> None:
    ok = client.post(
        "/admin/eventlog/query", json={"sql": "SELECT count() AS n FROM evapi.events"}, headers=AUTH
    )
    assert ok.status_code == 200 and ok.json()["rows"] == [[len(history())]]
    refused = client.post("/admin/eventlog/query", json={"sql": "DROP TABLE evapi.events"}, headers=AUTH)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "read_only"
    bad = client.post("/admin/eventlog/query", json={"sql": "SELECT nope FROM evapi.events"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "query_failed"
    malformed = client.post("/admin/eventlog/query", json={"sql": 5, "extra": 1}, headers=AUTH)
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    bad_filter = client.post(
        "/admin/eventlog/episodes", json={"min_reward": 2, "max_reward": 1}, headers=AUTH
    )
    assert bad_filter.status_code == 400


def test_reader_over_http_matches_the_store(reader: HttpEventLogReader, store: ChdbStore) -> None:
    f = EpisodeFilter(tenant="acme")
    assert reader.episodes(f) == store.episodes(f)
    assert reader.episode_events(EP1) == store.episode_events(EP1)
    assert reader.stats(bucket="day") == store.stats(bucket="day")
    by_policy = reader.stats(bucket="day", by_policy=True)  # no adapters here: every row the base's
    assert by_policy == store.stats(bucket="day", by_policy=True) and {p.policy for p in by_policy} == {""}
    assert reader.stats(bucket="day", policy="writer") == store.stats(bucket="day", policy="writer") == []
    assert reader.counts() == store.counts()
    assert list(reader.select_scored_episodes(EpisodeFilter(min_reward=0.5))) == list(
        store.select_scored_episodes(EpisodeFilter(min_reward=0.5))
    )
    assert list(reader.select_calls(CallFilter(limit=4))) == list(store.select_calls(CallFilter(limit=4)))
    assert list(reader.select_scored_episodes(EpisodeFilter(tenant="nobody"))) == []
    assert reader.query("SELECT 1 AS one").rows == [[1]]
    with pytest.raises(ReadOnlyQueryError):
        reader.query("INSERT INTO evapi.events (event_id) VALUES ('x')")
    with pytest.raises(EventLogQueryError):
        reader.query("SELECT nope FROM evapi.events")


def test_reader_with_a_wrong_token_says_so(client: TestClient) -> None:
    wrong = HttpEventLogReader("http://testserver", "nope", client=client)
    with pytest.raises(EventLogError, match="refused the admin token"):
        wrong.counts()


def test_cli_reads_through_the_api(client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import infra.eventlog.client as client_module

    monkeypatch.setattr(
        client_module, "HttpEventLogReader",
        lambda url, token: HttpEventLogReader(url, token, client=client),
    )  # fmt: skip
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    from flywheel.cli.main import app

    runner = CliRunner()
    result = runner.invoke(
        app, ["query", "SELECT count() AS n FROM evapi.events", "--json", "--url", "http://testserver"]
    )
    assert result.exit_code == 0, result.stderr
    assert '"rows":[[' in result.stdout
    refused = runner.invoke(
        app, ["query", "ALTER TABLE evapi.events DELETE WHERE 1", "--url", "http://testserver"]
    )
    assert refused.exit_code == 2
    assert (
        refused.stderr.strip().startswith("ReadOnlyQueryError: ")
        and len(refused.stderr.strip().splitlines()) == 1
    )
    bad = runner.invoke(app, ["query", "SELECT nope FROM evapi.events", "--url", "http://testserver"])
    assert bad.exit_code == 2 and bad.stderr.startswith("EventLogQueryError: ")


def test_cli_episodes_ls(client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    import infra.eventlog.client as client_module

    monkeypatch.setattr(
        client_module, "HttpEventLogReader",
        lambda url, token: HttpEventLogReader(url, token, client=client),
    )  # fmt: skip
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("FLYWHEEL_ADMIN_URL", "http://testserver")
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    from flywheel.cli import eventlog_cmd

    cli = typer_app_with(eventlog_cmd.episodes_ls)
    runner = CliRunner()
    result = runner.invoke(cli, ["--tenant", "acme", "--min-reward", "0.5", "--json"])
    assert result.exit_code == 0, result.stderr
    assert [e["episode_id"][-1] for e in json.loads(result.stdout)] == ["1"]
    table = runner.invoke(cli, ["--group", "g2"])
    assert table.exit_code == 0 and "2 episode(s)" in table.stderr
    bad = runner.invoke(cli, ["--since", "yesterday-ish"])
    assert bad.exit_code == 2 and bad.stderr.startswith("FilterError: --since")
    reversed_range = runner.invoke(cli, ["--min-reward", "2", "--max-reward", "1"])
    assert reversed_range.exit_code == 2 and "min_reward" in reversed_range.stderr


def typer_app_with(command):  # type: ignore[no-untyped-def]
    import typer

    cli = typer.Typer()
    cli.command()(command)
    return cli
