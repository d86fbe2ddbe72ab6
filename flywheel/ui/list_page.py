"""The episode list: the filter form, one page of episode summaries, links to the next pages.

The rows are their own fragment (:func:`rows_html`), which the page's script fetches again every few
seconds (``/ui/episodes/rows`` with the same query) to stay live.
"""

from __future__ import annotations

from flywheel.ui.html import esc, layout, num
from flywheel.ui.params import SOURCES, STATUSES, ListQuery
from infra.eventlog.models import EpisodeSummary


def _select(name: str, label: str, options: tuple[str, ...], value: str) -> str:
    opts = '<option value="">any</option>' + "".join(
        f'<option value="{esc(o)}"{" selected" if o == value else ""}>{esc(o)}</option>' for o in options
    )
    return f'<label>{label}<select name="{name}" id="f-{name}">{opts}</select></label>'


def _input(name: str, label: str, value: str, placeholder: str = "", size: int = 10) -> str:
    return (
        f'<label>{label}<input name="{name}" id="f-{name}" value="{esc(value)}" '
        f'placeholder="{esc(placeholder)}" size="{size}"></label>'
    )


def form_html(q: ListQuery | None, values: dict[str, str]) -> str:
    v = values.get
    return (
        '<form method="get" class="filters" id="filters">'
        + _select("source", "source", SOURCES, v("source", ""))
        + _input("tenant", "tenant", v("tenant", ""))
        + _input("task", "task contains", v("task", ""))
        + _select("status", "status", STATUSES, v("status", ""))
        + _input("reward_min", "reward ≥", v("reward_min", ""), size=5)
        + _input("reward_max", "reward ≤", v("reward_max", ""), size=5)
        + _input("version_min", "version ≥", v("version_min", ""), size=4)
        + _input("version_max", "version ≤", v("version_max", ""), size=4)
        + _input("since", "since", v("since", ""), "1h or 2026-12-01T10:00", 14)
        + _input("until", "until", v("until", ""), "now", 14)
        + '<button type="submit" id="apply">Filter</button> <a href="?">clear</a></form>'
    )


def _versions(e: EpisodeSummary) -> str:
    if e.min_weight_version is None:
        return "–"
    if e.min_weight_version == e.max_weight_version:
        return str(e.min_weight_version)
    return f"{e.min_weight_version}–{e.max_weight_version}"


def rows_html(prefix: str, episodes: list[EpisodeSummary]) -> str:
    if not episodes:
        return '<tr class="empty"><td colspan="10">no episodes match</td></tr>'
    out = []
    for e in episodes:
        eid = esc(e.episode_id)
        out.append(
            f'<tr class="episode" data-episode="{eid}" data-reward="{esc(e.reward)}">'
            f'<td><a href="{prefix}/episodes/{eid}">{esc(e.episode_id[:12])}</a></td>'
            f"<td>{esc(e.started_at.strftime('%Y-%m-%d %H:%M:%S'))}</td>"
            f"<td>{esc(e.source)}</td><td>{esc(e.tenant)}</td><td>{esc(e.task_id)}</td>"
            f'<td class="status-{esc(e.status)}">{esc(e.status or "running")}</td>'
            f'<td class="n">{num(e.reward)}</td><td class="n">{e.num_calls}</td>'
            f'<td class="n">{num(e.num_transitions)}</td><td class="n">{_versions(e)}</td></tr>'
        )
    return "".join(out)


def list_page(prefix: str, q: ListQuery, episodes: list[EpisodeSummary]) -> str:
    more = len(episodes) > q.page_size
    shown = episodes[: q.page_size]
    pager = []
    if q.page > 1:
        pager.append(f'<a href="{esc(q.link(q.page - 1))}" id="prev">← newer</a>')
    pager.append(f"<span>page {q.page}</span>")
    if more:
        pager.append(f'<a href="{esc(q.link(q.page + 1))}" id="next">older →</a>')
    body = f"""<h1>Episodes</h1>
{form_html(q, q.values)}
<table class="list"><thead><tr><th>episode</th><th>started (UTC)</th><th>source</th><th>tenant</th>
<th>task</th><th>status</th><th>reward</th><th>calls</th><th>transitions</th><th>weights</th></tr></thead>
<tbody id="rows" data-refresh="{prefix}/episodes/rows{esc(q.link(q.page))}">{rows_html(prefix, shown)}</tbody>
</table>
<p class="pager">{" ".join(pager)} <span class="live" id="live">live</span></p>"""
    return layout(prefix, "Episodes", body, active="episodes", scripts=("ui.js",))
