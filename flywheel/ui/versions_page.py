"""The versions page: every release event of the event log, newest first.

The trainer's candidates (``version_proposed``), their gates (``version_evaluated``) and the decisions
that changed what serves production (``version_promoted``, ``version_rolled_back``, ``version_pinned``),
each with its time, policy (the adapter, or the model), version, who decided, the gate's verdict and
rule, and its figures. Filters: ``type`` (proposed, evaluated, promoted, rolled_back, pinned),
``policy`` and ``limit``; a value the page cannot use is a :class:`BadInput` (a 400 page) before any
query runs. The events are read with the reader's read-only ``query``, every value in the statement
either a constant of this module or checked against a strict pattern first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.ui.html import esc, layout, num
from flywheel.ui.params import BadInput
from infra.eventlog.base import DEFAULT_DATABASE
from infra.eventlog.ddl import check_identifier
from infra.eventlog.reader import EventLogReader

KINDS = ("proposed", "evaluated", "promoted", "rolled_back", "pinned")
LIMIT = 200
MAX_LIMIT = 2000
_POLICY = re.compile(r"^[A-Za-z0-9_.:@/\-]{1,128}$")  # a model or adapter name; no quote can pass
_FIGURES_SHOWN = 6


@dataclass(frozen=True, slots=True)
class ReleaseQuery:
    kind: str | None = None  # one of KINDS; None: every release event
    policy: str | None = None
    limit: int = LIMIT


@dataclass(frozen=True, slots=True)
class ReleaseRow:
    """One release event, as the page shows it."""

    at: str
    kind: str
    policy: str
    version: str  # "3", "0 → 3" (promoted from 0), "3 → 1" (rolled back to 1), "off" (unpinned)
    decided_by: str
    verdict: str  # "passed" / "failed" for an evaluation, else ""
    rule: str
    reason: str
    figures: dict[str, float] = field(default_factory=dict)
    served_figures: dict[str, float] = field(default_factory=dict)


def parse_release_query(query: Mapping[str, str]) -> ReleaseQuery:
    """Read the page's query string; :class:`BadInput` names the first value it cannot use."""
    kind = query.get("type", "").strip() or None
    if kind is not None and kind not in KINDS:
        raise BadInput(f"type must be one of {', '.join(KINDS)}, not {kind[:40]!r}", "type")
    policy = query.get("policy", "").strip() or None
    if policy is not None and not _POLICY.match(policy):
        raise BadInput(f"policy must be a model or adapter name, not {policy[:40]!r}", "policy")
    raw = query.get("limit", "").strip() or str(LIMIT)
    try:
        limit = int(raw)
    except ValueError:
        raise BadInput(f"limit must be a whole number, not {raw[:40]!r}", "limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"limit must be between 1 and {MAX_LIMIT}, not {limit}", "limit")
    return ReleaseQuery(kind, policy, limit)


def release_events_sql(database: str, q: ReleaseQuery) -> str:
    """The newest ``q.limit`` release events (each once), newest first."""
    kinds = [f"version_{q.kind}"] if q.kind else [f"version_{k}" for k in KINDS]
    conds = ["type IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"]
    if q.policy is not None:
        conds.append(f"if(adapter != '', adapter, model) = '{q.policy}'")  # checked by _POLICY
    return f"""
        SELECT emitted_at, type, if(adapter != '', adapter, model) AS policy, weight_version, payload
        FROM {check_identifier(database)}.events
        WHERE {" AND ".join(conds)}
        ORDER BY emitted_at DESC, event_id DESC
        LIMIT 1 BY event_id
        LIMIT {int(q.limit)}
    """


def _figures(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _version(kind: str, version: int, body: dict[str, Any]) -> str:
    if kind == "version_promoted" and body.get("previous") is not None:
        return f"{body['previous']} → {version}"
    if kind == "version_rolled_back":
        return f"{version} → {body.get('to', '?')}"
    if kind == "version_pinned" and version < 0:
        return "off"
    return str(version)


def release_row(at: object, kind: str, policy: str, version: int, payload: str) -> ReleaseRow:
    """One row of the query above; a payload that is not JSON leaves only the columns."""
    try:
        body = json.loads(payload)
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    passed = body.get("passed")
    return ReleaseRow(
        at=str(at),
        kind=kind.removeprefix("version_"),
        policy=policy,
        version=_version(kind, version, body),
        decided_by=str(body.get("decided_by") or body.get("producer") or ""),
        verdict="" if passed is None else ("passed" if passed else "failed"),
        rule=str(body.get("rule") or ""),
        reason=str(body.get("reason") or ""),
        figures=_figures(body.get("figures")) or _figures({"step": body.get("step")}),
        served_figures=_figures(body.get("served_figures")),
    )


def read_release_events(reader: EventLogReader, q: ReleaseQuery) -> list[ReleaseRow]:
    """The release events ``q`` asks for, through the reader's read-only query."""
    database = str(getattr(reader, "database", DEFAULT_DATABASE))  # the stores name their database
    result = reader.query(release_events_sql(database, q), max_rows=q.limit)
    rows = []
    for at, kind, policy, version, payload in result.rows:
        rows.append(release_row(at, str(kind), str(policy), int(str(version)), str(payload)))
    return rows


def _figure_text(figures: dict[str, float]) -> str:
    shown = sorted(figures.items())[:_FIGURES_SHOWN]
    more = f" (+{len(figures) - len(shown)})" if len(figures) > len(shown) else ""
    return ", ".join(f"{k} {num(v) if math.isfinite(v) else v}" for k, v in shown) + more


def _rows(rows: list[ReleaseRow]) -> str:
    out = []
    for r in rows:
        served = (
            f"<br><small>served: {esc(_figure_text(r.served_figures))}</small>" if r.served_figures else ""
        )
        out.append(
            f'<tr class="release" data-type="{esc(r.kind)}" data-policy="{esc(r.policy)}">'
            f"<td>{esc(r.at.replace('T', ' ')[:19])}</td><td>{esc(r.kind)}</td><td>{esc(r.policy)}</td>"
            f'<td class="n">{esc(r.version)}</td><td>{esc(r.decided_by)}</td>'
            f'<td class="status-{esc(r.verdict)}">{esc(r.verdict)}</td><td>{esc(r.rule)}</td>'
            f"<td>{esc(r.reason)}</td><td>{esc(_figure_text(r.figures))}{served}</td></tr>"
        )
    return "".join(out)


def _form(q: ReleaseQuery) -> str:
    options = '<option value="">any</option>' + "".join(
        f'<option value="{k}"{" selected" if k == q.kind else ""}>{k}</option>' for k in KINDS
    )
    return (
        '<form method="get" class="filters" id="filters">'
        f'<label>type<select name="type" id="f-type">{options}</select></label>'
        f'<label>policy<input name="policy" id="f-policy" value="{esc(q.policy or "")}" size="12"></label>'
        f'<label>limit<input name="limit" id="f-limit" value="{q.limit}" size="5"></label>'
        '<button type="submit" id="apply">Filter</button> <a href="?">clear</a></form>'
    )


def versions_page(prefix: str, q: ReleaseQuery, rows: list[ReleaseRow]) -> str:
    if rows:
        table = (
            '<table class="list" id="releases"><thead><tr><th>at (UTC)</th><th>type</th><th>policy</th>'
            "<th>version</th><th>decided by</th><th>gates</th><th>rule</th><th>reason</th><th>figures</th>"
            f"</tr></thead><tbody>{_rows(rows)}</tbody></table>"
        )
    elif q.kind is None and q.policy is None:
        table = '<p class="empty" id="empty">no release events yet</p>'
    else:
        table = '<p class="empty" id="empty">no release events match</p>'
    body = f"<h1>Versions</h1>{_form(q)}{table}"
    return layout(prefix, "Versions", body, active="versions")
