"""``flywheel episodes open|show|ls``: training episodes through a running gateway's admin API.

``ls`` reads the event log instead; it lives with the event-log commands (``eventlog_cmd``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from flywheel.cli.common import fail, register_ls
from flywheel.cli.eventlog_cmd import episodes_ls
from gateway.settings import GatewaySettings

episodes_app = typer.Typer(help="Open and inspect training episodes.", no_args_is_help=True)
register_ls(episodes_app, episodes_ls)

GatewayUrl = Annotated[
    str | None,
    typer.Option(
        "--gateway", envvar="FLYWHEEL_GATEWAY_URL", help="gateway base URL (default: from settings)"
    ),
]


def register(app: typer.Typer) -> None:
    app.add_typer(episodes_app, name="episodes")


def admin_request(gateway: str | None, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One admin call to a running gateway; errors become one-line CLI errors."""
    try:
        settings = GatewaySettings()
    except Exception as exc:
        fail(f"bad settings: {exc}")
        raise
    base = (gateway or f"http://{settings.gateway_host}:{settings.gateway_port}").rstrip("/")
    headers = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}
    try:
        r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {base}: {type(exc).__name__} (is `flywheel gateway` running?)")
    if r.status_code >= 400:
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text[:300]
        fail(f"gateway answered {r.status_code}: {msg}")
    return r.json()


@episodes_app.command("open")
def open_command(
    gateway: GatewayUrl = None,
    task_id: Annotated[str | None, typer.Option("--task-id", help="The task the episode runs.")] = None,
    group_id: Annotated[
        str | None, typer.Option("--group-id", help="The group it belongs to (GRPO compares within one).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the gateway's answer as JSON.")] = False,
) -> None:
    """Open a training episode and print its base URL (use it as OPENAI_BASE_URL)."""
    body = {k: v for k, v in {"task_id": task_id, "group_id": group_id}.items() if v}
    data = admin_request(gateway, "POST", "/admin/episodes", body)
    typer.echo(json.dumps(data) if as_json else data["base_url"])


@episodes_app.command("show")
def show_command(
    episode_id: Annotated[str, typer.Argument(help="the episode id")],
    gateway: GatewayUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The episode's calls in order (text, token ids, logprobs, weight version), then the spans the
    agent sent the gateway's OTLP intake (its steps and tool calls, with their durations)."""
    if not episode_id or len(episode_id) > 64 or not episode_id.isalnum():
        fail("episode id must be 1-64 letters or digits")
    data = admin_request(gateway, "GET", f"/admin/episodes/{episode_id}")
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    print_calls(data["calls"], title=f"episode {episode_id}")
    if data.get("spans"):
        print_spans(data["spans"])


def print_calls(calls: list[dict[str, Any]], *, title: str = "") -> None:
    """A table of recorded calls (``LLMCallRecorded`` as JSON), one row per choice."""
    table = Table(title=title or None)
    for col in (
        "seq",
        "endpoint",
        "status",
        "version",
        "faithful",
        "extends",
        "prompt ids",
        "text",
        "ids",
        "logprobs",
    ):
        table.add_column(col, overflow="fold")
    for c in calls:
        for ch in c.get("choices") or [{"text": c.get("error") or ""}]:
            ids = ch.get("token_ids") or []
            lps = ch.get("logprobs") or []
            table.add_row(
                str(c["call_seq"]),
                str(c["endpoint"]),
                str(c["status_code"]),
                str(c["weight_version"]),
                "yes" if c["token_faithful"] else "no",
                {True: "yes", False: "MISMATCH", None: "-"}[c.get("extends_previous")],
                str(len(ch.get("prompt_token_ids") or c.get("prompt_token_ids") or [])),
                _short(str(ch.get("text") or (ch.get("message") or {}).get("tool_calls") or ""), 80),
                _short(str(ids), 40),
                _short(", ".join(f"{x:.3f}" for x in lps), 40),
            )
    Console().print(table)
    typer.echo(f"{len(calls)} call(s) recorded")


def print_spans(spans: list[dict[str, Any]]) -> None:
    """The agent's own spans (``AgentSpan`` as JSON) in start order, indented under their parents."""
    ids = {s["span_id"] for s in spans}
    parent = {s["span_id"]: s.get("parent_span_id") for s in spans}

    def depth(span_id: str) -> int:
        n, up = 0, parent.get(span_id)
        while up in ids and n < 32:
            n, up = n + 1, parent.get(up)
        return n

    first = min(datetime.fromisoformat(s["start_time"]) for s in spans)
    table = Table(title="agent spans (OTLP)")
    for col in ("at ms", "span", "kind", "ms", "status"):
        table.add_column(col, overflow="fold")
    for s in sorted(spans, key=lambda s: s["start_time"]):
        attrs = s.get("attributes") or {}
        kind = attrs.get("openinference.span.kind") or attrs.get("gen_ai.operation.name") or s.get("kind")
        at = (datetime.fromisoformat(s["start_time"]) - first).total_seconds() * 1000
        table.add_row(
            f"{at:.1f}",
            "  " * depth(s["span_id"]) + _short(str(s["name"]), 60),
            str(kind),
            f"{s['duration_ms']:.1f}",
            str(s.get("status") or ""),
        )
    Console().print(table)
    typer.echo(f"{len(spans)} span(s) from the agent")


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
