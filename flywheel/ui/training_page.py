"""The training page: charts over trainer steps, weight versions and time, and feedback per tenant.

The page is a frame; its script draws the charts (Chart.js, served from ``static/``) from
:func:`training_data` at ``/ui/api/training`` and fetches it again every few seconds.
"""

from __future__ import annotations

from typing import Any

from flywheel.ui.html import esc, layout, num
from infra.eventlog.models import StatsPoint, TenantFeedback, TrainerStepPoint, VersionPoint

# (chart id, title, x axis, [(series label, figure)]) over trainer steps: the figures StepMetrics names
STEP_CHARTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", "Reward and success per step", (("reward", "reward"), ("success", "success"))),
    ("staleness", "Staleness (versions behind)", (("mean", "staleness_mean"), ("max", "staleness_max"))),
    (
        "importance",
        "Importance weights",
        (("TIS mean", "tis_mean"), ("ratio mean", "ratio_mean"), ("TIS capped share", "tis_capped_fraction")),
    ),
    ("episode_shape", "Transitions per episode", (("transitions / episode", "transitions_per_episode"),)),
)
SOURCES = ("live", "production", "replay")


def training_data(
    steps: list[TrainerStepPoint],
    versions: list[VersionPoint],
    stats: list[StatsPoint],
    tenants: list[TenantFeedback],
) -> dict[str, Any]:
    """Every chart's labels and series, JSON-ready (missing figures are null: gaps in the line)."""
    labels = [p.step for p in steps]
    charts: dict[str, Any] = {}
    for chart_id, _, series in STEP_CHARTS:
        charts[chart_id] = {
            "labels": labels,
            "series": {label: [p.metrics.get(name) for p in steps] for label, name in series},
        }
    reasons = sorted({k for p in steps for k in p.metrics if k.startswith("excluded_")})
    charts["excluded"] = {
        "labels": labels,
        "series": {k.removeprefix("excluded_"): [p.metrics.get(k, 0.0) for p in steps] for k in reasons},
        "stacked": True,
    }
    charts["samples"] = {
        "labels": labels,
        "series": {src: [p.samples.get(src, 0) for p in steps] for src in SOURCES},
        "stacked": True,
    }
    charts["versions"] = {
        "labels": [v.weight_version for v in versions],
        "series": {
            "mean reward": [v.mean_reward for v in versions],
            "success rate": [v.success_rate for v in versions],
            "calls / episode": [v.mean_calls for v in versions],
        },
    }
    charts["time"] = {
        "labels": [p.bucket.strftime("%m-%d %H:%M") for p in stats],
        "series": {
            "mean reward": [p.mean_reward for p in stats],
            "success rate": [p.success_rate for p in stats],
            "calls / episode": [p.mean_calls for p in stats],
            "feedback rate": [p.feedback_rate for p in stats],
        },
    }
    charts["tenants"] = {
        "labels": [t.tenant or "(none)" for t in tenants],
        "series": {"feedback rate": [t.feedback_rate for t in tenants]},
        "bar": True,
    }
    return {
        "charts": charts,
        "steps": [
            {"step": p.step, "version": p.version, "at": p.at.isoformat(), "adapter": p.adapter}
            for p in steps
        ],
    }


def _tenants(tenants: list[TenantFeedback]) -> str:
    if not tenants:
        return "<p>no scored production sessions yet</p>"
    rows = "".join(
        f"<tr><td>{esc(t.tenant or '(none)')}</td><td class='n'>{t.sessions}</td>"
        f"<td class='n'>{t.with_feedback}</td><td class='n'>{num(t.feedback_rate)}</td>"
        f"<td class='n'>{num(t.thumbs_up_rate)}</td></tr>"
        for t in tenants
    )
    return (
        '<table class="list" id="tenants"><thead><tr><th>tenant</th><th>sessions</th><th>with feedback</th>'
        f"<th>feedback rate</th><th>thumbs-up rate</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _excluded(point: TrainerStepPoint) -> str:
    """``reason n, ...`` of what the step's batch left out (``excluded_<reason>`` figures)."""
    return ", ".join(
        f"{k.removeprefix('excluded_')} {v:g}"
        for k, v in sorted(point.metrics.items())
        if k.startswith("excluded_") and v
    )


def _steps(steps: list[TrainerStepPoint]) -> str:
    if not steps:
        return "<p>no trainer steps recorded yet</p>"
    rows = "".join(
        f'<tr class="step" data-step="{p.step}"><td class="n">{p.step}</td><td class="n">{p.version}</td>'
        f"<td>{esc(p.adapter)}</td><td>{esc(p.at.strftime('%H:%M:%S'))}</td>"
        f"<td class='n'>{num(p.metrics.get('reward'))}</td><td class='n'>{num(p.metrics.get('loss'))}</td>"
        f"<td>{esc(', '.join(f'{k} {v}' for k, v in sorted(p.samples.items())))}</td>"
        f"<td>{esc(_excluded(p))}</td></tr>"
        for p in reversed(steps[-50:])
    )
    return (
        '<table class="list" id="steps"><thead><tr><th>step</th><th>version</th><th>adapter</th>'
        "<th>at (UTC)</th><th>reward</th><th>loss</th><th>samples</th><th>left out</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def training_page(
    prefix: str, steps: list[TrainerStepPoint], tenants: list[TenantFeedback], bucket: str
) -> str:
    titles = [(c, t) for c, t, _ in STEP_CHARTS] + [
        ("samples", "Samples per source per step"),
        ("excluded", "Left out of training per step, by reason"),
        ("versions", "Per weight version (scored episodes)"),
        ("time", f"Over time (per {bucket})"),
        ("tenants", "Production feedback rate per tenant"),
    ]
    charts = "".join(
        f'<figure><figcaption>{esc(title)}</figcaption><canvas id="chart-{cid}"></canvas></figure>'
        for cid, title in titles
    )
    body = (
        f'<h1>Training</h1><div class="charts" id="charts" data-bucket="{esc(bucket)}">{charts}</div>'
        f"<h2>Latest trainer steps</h2>{_steps(steps)}<h2>Feedback per tenant</h2>{_tenants(tenants)}"
        '<p class="pager"><span class="live" id="live">live</span></p>'
    )
    return layout(prefix, "Training", body, active="training", scripts=("chart.umd.min.js", "ui.js"))
