"""``flywheel ui``: the web view of the event log (episodes, one episode's tokens, training) on its own.

It reads the event log directly: the ClickHouse server of ``FLYWHEEL_CLICKHOUSE_URL``, else the chdb
directory under the data directory (which it then holds, as any reader does: a running ``flywheel up``
serves the same view itself at ``<its URL>/ui``). Sign in with ``FLYWHEEL_ADMIN_TOKEN``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError

from flywheel.cli.common import fail, refuse_exposure, usage
from flywheel.ui.app import SignIn, create_ui_app
from flywheel.ui.auth import SessionStore
from infra.eventlog.errors import EventLogError, EventLogLockedError
from infra.eventlog.lock import chdb_holder
from infra.eventlog.settings import EventLogSettings
from infra.eventlog.store import open_store
from infra.logging import configure_logging
from infra.service import KEEP_ALIVE_S


def ui_command(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port of the view.")] = 8200,
    host: Annotated[str, typer.Option("--host", help="Interface to serve on.")] = "127.0.0.1",
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Where the chdb event log is (FLYWHEEL_DATA_DIR).")
    ] = None,
) -> None:
    """Serve the web view of the event log: episodes, their calls and tokens, training charts."""
    try:
        settings = EventLogSettings()
        if data_dir is not None:
            settings = settings.model_copy(update={"data_dir": data_dir})
    except ValidationError as exc:
        usage(str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, "))
    refuse_exposure(host, settings.admin_token.get_secret_value())
    configure_logging("WARNING", settings.log_json)
    if not settings.clickhouse_url:
        path = settings.chdb_path.resolve()
        holder = chdb_holder(path)
        if holder is not None:
            fail(
                f"{path} is held by process {holder.pid}; if that is `flywheel up`, open the view it "
                "serves at http://<its host:port>/ui instead"
            )
        if not path.exists():
            fail(
                f"no event log at {path} (nothing recorded here yet); give --data-dir or FLYWHEEL_CLICKHOUSE_URL"
            )
    try:
        store = open_store(
            clickhouse_url=settings.clickhouse_url,
            chdb_path=settings.chdb_path,
            database=settings.clickhouse_database,
            migrate=not settings.clickhouse_url,
        )
    except (EventLogLockedError, EventLogError) as exc:
        fail(str(exc))
    try:
        sessions = SessionStore(idle_s=settings.ui_session_idle_s, max_s=settings.ui_session_max_s)
        app = create_ui_app(
            store,
            settings.admin_token.get_secret_value(),
            sign_in=SignIn(sessions, bound_host=host),
            allowed_hosts=settings.allowed_hosts,
        )
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S
        )
        server = uvicorn.Server(config)
        typer.echo(f"flywheel ui: http://{host}:{port}/ui/ (sign in with FLYWHEEL_ADMIN_TOKEN)", err=True)
        server.run()
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    app.command("ui")(ui_command)
