"""``flywheel versions ls | show VERSION | promote VERSION | rollback | pin VERSION|--off | canary VERSION``.

Which version of each policy serves production, through the gateway's admin API (``/admin/versions``;
``--url`` or ``FLYWHEEL_ADMIN_URL``: the gateway's address) with the admin token. The gateway keeps the
release book and checks every request against it: a request it refuses (an unknown version, one that
failed its gates, a pinned policy, nothing to roll back to) is one line on stderr, exit 1, and nothing
changes. ``--adapter NAME`` names a LoRA adapter's policy; without it, the whole model's. ``--json``
prints the gateway's answer as it came.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from flywheel.cli.common import (
    ADMIN_URL_HELP,
    JSON_HELP,
    admin_url,
    fail,
    load_settings,
    print_json,
    register_ls,
    run_service,
    usage,
)
from flywheel.ops.admin import AdminClient, AdminError

Url = Annotated[str | None, typer.Option("--url", help=ADMIN_URL_HELP)]
AsJson = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
Adapter = Annotated[
    str | None, typer.Option("--adapter", help="The LoRA adapter's policy (default: the whole model's).")
]
Reason = Annotated[str, typer.Option("--reason", help="Why, recorded with the decision.")]
By = Annotated[
    str | None, typer.Option("--by", help="Who decides, recorded with the decision (default: cli:$USER).")
]
Version = Annotated[int, typer.Argument(min=0, help="The version (0: the starting weights).")]


def _by(option: str | None) -> str:
    by = option if option is not None else f"cli:{os.environ.get('USER') or 'operator'}"
    if not by.strip() or len(by) > 256:
        usage("--by must be 1 to 256 characters")
    return by


def _decision(adapter: str | None, by: str | None, reason: str) -> dict[str, Any]:
    if len(reason) > 1024:
        usage("--reason must be at most 1024 characters")
    if adapter is not None and not 1 <= len(adapter) <= 128:
        usage("--adapter must be 1 to 128 characters")
    return {"adapter": adapter, "by": _by(by), "reason": reason}


def _call(url: str | None, method: str, path: str, body: Any = None) -> Any:
    """One request to the admin API; anything but an answer is one line and exit 1."""
    target = admin_url(url)
    if not target:
        usage(
            "the release book lives in the gateway: pass --url (its admin URL; `flywheel up` prints it) "
            "or set FLYWHEEL_ADMIN_URL"
        )
    client = AdminClient(target, load_settings().admin_token.get_secret_value(), timeout_s=15)
    try:
        return asyncio.run(client.request(method, path, json=body))
    except AdminError as exc:
        fail(str(exc))


def _score(version: dict[str, Any]) -> str:
    figures = (version.get("evaluation") or {}).get("figures") or {}
    score = figures.get("score")
    return "–" if score is None else f"{float(score):.4g}"


def _gate(version: dict[str, Any]) -> str:
    evaluation = version.get("evaluation")
    if not evaluation:
        return ""
    return f"{'passed' if evaluation.get('passed') else 'failed'} ({evaluation.get('rule') or '-'})"


def policy_table(release: dict[str, Any]) -> list[str]:
    """One policy's lines: a header, then its versions newest first (``*``: the one that serves)."""
    pinned = ", pinned" if release.get("pinned") else ""
    lines = [f"{release['name']}: version {release['served']} serves{pinned}"]
    lines.append(f"  {'':1} {'version':>7}  {'status':<12} {'step':>7}  {'score':>8}  gates")
    for v in sorted(release.get("versions", []), key=lambda v: -int(v["version"])):
        mark = "*" if v["version"] == release["served"] else " "
        row = f"  {mark} {v['version']:>7}  {v['status']:<12} {v.get('step') or 0:>7}  {_score(v):>8}"
        lines.append(f"{row}  {_gate(v)}".rstrip())
    return lines


def decision_line(answer: dict[str, Any]) -> str:
    """``policy: version 3 serves (was 0), decided by cli:alice`` for a promotion, rollback or pin."""
    event, release = answer["event"], answer["release"]
    name, by = release["name"], event.get("decided_by", "?")
    kind = event.get("type")
    if kind == "version_promoted":
        what = f"version {event['version']} serves (was {event.get('previous')})"
    elif kind == "version_rolled_back":
        what = f"version {event['to']} serves (was {event['version']}, rolled back)"
    elif kind == "version_canary":
        what = f"version {event['version']} serves {event['share']:.0%} of new sessions (canary)"
    elif event.get("version") is None:
        what = f"unpinned (version {release['served']} serves)"
    else:
        what = f"pinned to version {event['version']}, which serves"
    return f"{name}: {what}, decided by {by}"


def ls_command(url: Url = None, adapter: Adapter = None, as_json: AsJson = False) -> None:
    """Every policy's served version and its versions, with status, step and score."""
    book = _call(url, "GET", "/admin/versions")
    if as_json:
        print_json(book)
        return
    policies = [p for p in book.get("policies", []) if adapter is None or p.get("adapter") == adapter]
    if not policies:
        typer.echo(f"no releases for {adapter or book.get('model', 'the model')} yet")
        return
    for i, release in enumerate(policies):
        if i:
            typer.echo("")
        typer.echo("\n".join(policy_table(release)))


def show_command(version: Version, url: Url = None, adapter: Adapter = None, as_json: AsJson = False) -> None:
    """One version: its status, weights, step and evaluation."""
    query = "?" + urlencode({"adapter": adapter}) if adapter is not None else ""
    found = _call(url, "GET", f"/admin/versions/{version}{query}")
    if as_json:
        print_json(found)
        return
    evaluation = found.get("evaluation") or {}
    typer.echo(f"{found['policy']}: version {found['version']}  {found['status']}")
    for key in ("step", "checkpoint_path", "proposed_at"):
        typer.echo(f"  {key:<16} {found.get(key) if found.get(key) is not None else '–'}")
    if not evaluation:
        typer.echo(f"  {'gates':<16} not evaluated")
        return
    typer.echo(f"  {'gates':<16} {_gate(found)} by {evaluation.get('decided_by', '?')}")
    for label, key in (("figures", "figures"), ("served figures", "served_figures")):
        figures = evaluation.get(key) or {}
        text = "  ".join(f"{k} {float(v):.4g}" for k, v in sorted(figures.items()))
        typer.echo(f"  {label:<16} {text or '–'}")


def _decide(url: str | None, action: str, body: dict[str, Any], as_json: bool) -> None:
    answer = _call(url, "POST", f"/admin/versions/{action}", body)
    if as_json:
        print_json(answer)
    else:
        typer.echo(decision_line(answer))


def promote_command(
    version: Version,
    url: Url = None,
    adapter: Adapter = None,
    reason: Reason = "",
    by: By = None,
    as_json: AsJson = False,
) -> None:
    """Serve VERSION to production from the next call on (refused if it failed its gates or is pinned)."""
    _decide(url, "promote", {"version": version, **_decision(adapter, by, reason)}, as_json)


def rollback_command(
    url: Url = None, adapter: Adapter = None, reason: Reason = "", by: By = None, as_json: AsJson = False
) -> None:
    """Take the served version out and serve the one that served before it."""
    _decide(url, "rollback", _decision(adapter, by, reason), as_json)


def pin_command(
    version: Annotated[
        int | None, typer.Argument(min=0, help="The version to pin (omit with --off).")
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Unpin: rules may promote and roll back again.")] = False,
    url: Url = None,
    adapter: Adapter = None,
    reason: Reason = "",
    by: By = None,
    as_json: AsJson = False,
) -> None:
    """Keep production on VERSION (it serves from the next call on) until `pin --off`."""
    if (version is None) == (not off):
        usage("give a VERSION to pin, or --off to unpin (not both)")
    _decide(url, "pin", {"version": version, **_decision(adapter, by, reason)}, as_json)


def canary_command(
    version: Version,
    share: Annotated[float, typer.Option("--share", help="The share of production sessions, in (0, 1).")],
    url: Url = None,
    adapter: Adapter = None,
    reason: Reason = "",
    by: By = None,
    as_json: AsJson = False,
) -> None:
    """Send a share of production sessions (each session sticks) to VERSION beside the served one."""
    _decide(url, "canary", {"version": version, "share": share, **_decision(adapter, by, reason)}, as_json)


def gates_command(
    config: Annotated[
        Path, typer.Option("--config", help="gates.json: the eval suite, the agent, the rules.")
    ],
) -> None:
    """Run the gate keeper alone: every release candidate evaluated, canaries judged (on the configured bus)."""
    from flywheel.alone import serve_gates

    run_service(serve_gates(load_settings(), config))


def register(app: typer.Typer) -> None:
    versions = typer.Typer(help="Which version of each policy serves production.", no_args_is_help=True)
    app.add_typer(versions, name="versions")
    register_ls(versions, ls_command)
    versions.command("show")(show_command)
    versions.command("promote")(promote_command)
    versions.command("rollback")(rollback_command)
    versions.command("pin")(pin_command)
    versions.command("canary")(canary_command)
    app.command("gates")(gates_command)
