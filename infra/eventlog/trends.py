"""The SQL behind the training view's charts, as (text, parameters) pairs (see :mod:`queries`).

Each query aggregates in the engine and returns one row per trainer step, weight version or tenant,
never one per call or per event. Values travel as bound parameters; only the checked database name
is spliced.
"""

from __future__ import annotations

from datetime import datetime

from infra.eventlog.queries import FEEDBACK_BY_EPISODE, Params, _time_conds


def trainer_steps(db: str, since: datetime | None, limit: int) -> tuple[str, Params]:
    """The latest ``limit`` trainer steps, oldest first: step, version, time, adapter, figures as JSON."""
    params: Params = {"limit": limit}
    conds = ["type = 'trainer_step_completed'", *_time_conds(since, None, params)]
    sql = f"""
        SELECT step, version, at, adapter, metrics, samples FROM (
            SELECT
                JSONExtractInt(payload, 'step') AS step,
                weight_version AS version,
                emitted_at AS at,
                adapter,
                JSONExtractRaw(payload, 'metrics') AS metrics,
                JSONExtractRaw(payload, 'samples') AS samples
            FROM {db}.events WHERE {" AND ".join(conds)}
            ORDER BY emitted_at DESC, event_id DESC
            LIMIT 1 BY event_id
            LIMIT {{limit:UInt64}}
        )
        ORDER BY at, step
    """
    return sql, params


def by_version(db: str, since: datetime | None, success_threshold: float) -> tuple[str, Params]:
    """Scored episodes (each with its latest score, replays left out) per serving weight version."""
    params: Params = {"thr": success_threshold}
    conds = ["type = 'episode_scored'", "source != 'replay'", *_time_conds(since, None, params)]
    sql = f"""
        SELECT
            s_version AS weight_version,
            count() AS episodes,
            avgOrNull(s_reward) AS mean_reward,
            if(countIf(s_reward IS NOT NULL) > 0,
               countIf(s_reward >= {{thr:Float64}}) / countIf(s_reward IS NOT NULL), NULL) AS success_rate,
            avg(greatest(s_calls, 0)) AS mean_calls
        FROM (
            SELECT
                episode_id,
                argMax(reward, emitted_at) AS s_reward,
                argMax(num_calls, emitted_at) AS s_calls,
                argMax(weight_version, emitted_at) AS s_version
            FROM {db}.events WHERE {" AND ".join(conds)}
            GROUP BY episode_id
        )
        WHERE s_version >= 0
        GROUP BY weight_version ORDER BY weight_version
    """
    return sql, params


def tenant_feedback(
    db: str, since: datetime | None, success_threshold: float, limit: int = 100
) -> tuple[str, Params]:
    """Per tenant, its scored production sessions and the share with user feedback (most sessions first)."""
    params: Params = {"thr": success_threshold, "limit": limit}
    conds = ["type = 'episode_scored'", "source = 'production'", *_time_conds(since, None, params)]
    sql = f"""
        SELECT
            s_tenant AS tenant,
            count() AS sessions,
            countIf(has_feedback = 1) AS with_feedback,
            countIf(has_feedback = 1) / count() AS feedback_rate,
            if(countIf(has_feedback = 1) > 0,
               countIf(has_feedback = 1 AND positive = 1) / countIf(has_feedback = 1), NULL) AS thumbs_up_rate
        FROM (
            SELECT episode_id, argMax(tenant, emitted_at) AS s_tenant
            FROM {db}.events WHERE {" AND ".join(conds)}
            GROUP BY episode_id
        ) AS scored
        LEFT JOIN ({FEEDBACK_BY_EPISODE.format(db=db)}) AS feedback USING (episode_id)
        GROUP BY tenant ORDER BY sessions DESC, tenant
        LIMIT {{limit:UInt64}}
    """
    return sql, params
