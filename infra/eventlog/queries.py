"""The SQL of the queries the rest of Flywheel needs, as (text, parameters) pairs.

Values always travel as ``{name:Type}`` query parameters (bound by the engine, never spliced into the
text); only the database identifier is spliced, after :func:`infra.eventlog.ddl.check_identifier`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from infra.eventlog.models import Bucket, CallFilter, EpisodeFilter

Params = dict[str, Any]


def _bind(conds: list[str], params: Params, clause: str, name: str, value: Any) -> None:
    """Add ``clause`` (which refers to ``{name:Type}``) and bind ``value`` — unless the filter is unset."""
    if value is not None:
        conds.append(clause)
        params[name] = value


def _time_conds(since: datetime | None, until: datetime | None, params: Params) -> list[str]:
    conds: list[str] = []
    _bind(conds, params, "emitted_at >= {since:DateTime64(3, 'UTC')}", "since", since)
    _bind(conds, params, "emitted_at < {until:DateTime64(3, 'UTC')}", "until", until)
    return conds


def episode_events(db: str, episode_id: str) -> tuple[str, Params]:
    sql = f"""
        SELECT event_id, type, topic, emitted_at, call_seq, weight_version, reward, status, payload
        FROM {db}.events FINAL
        WHERE episode_id = {{episode_id:String}}
        ORDER BY emitted_at, if(call_seq < 0, 2147483647, call_seq), event_id
    """
    return sql, {"episode_id": episode_id}


def episodes(db: str, f: EpisodeFilter) -> tuple[str, Params]:
    """Summaries of the episodes that have an event in the time range and match the filter.

    The inner query finds candidate ids (partition-pruned by time, skip indexes for tenant/group/task);
    the outer one aggregates all their events through the primary key with idempotent aggregates, so
    duplicate rows change nothing.
    """
    params: Params = {}
    inner = ["episode_id != ''", *_time_conds(f.since, f.until, params)]
    for column, value in (("tenant", f.tenant), ("group_id", f.group_id), ("task_id", f.task_id)):
        if value is not None:
            inner.append(f"{column} = {{{column}:String}}")
            params[column] = value
    _bind(inner, params, "task_id LIKE {task_like:String}", "task_like", f.task_id_like)
    if f.episode_ids is not None:
        inner.append("episode_id IN {episode_ids:Array(String)}")
        params["episode_ids"] = list(f.episode_ids)
    having: list[str] = []
    _bind(having, params, "source = {source:String}", "source", f.source)
    _bind(having, params, "status = {status:String}", "status", f.status)
    _bind(having, params, "reward >= {min_reward:Float64}", "min_reward", f.min_reward)
    _bind(having, params, "reward <= {max_reward:Float64}", "max_reward", f.max_reward)
    _bind(having, params, "min_weight_version >= {min_wv:Int64}", "min_wv", f.min_weight_version)
    _bind(having, params, "max_weight_version <= {max_wv:Int64}", "max_wv", f.max_weight_version)
    params["limit"], params["offset"] = f.limit, f.offset
    sql = f"""
        SELECT
            episode_id,
            anyIf(task_id, task_id != '') AS task_id,
            anyIf(group_id, group_id != '') AS group_id,
            anyIf(tenant, tenant != '') AS tenant,
            if(countIf(type = 'episode_started') > 0, anyIf(source, type = 'episode_started'),
               argMinIf(source, emitted_at, source != '')) AS source,
            if(countIf(type = 'episode_scored') > 0, argMaxIf(status, emitted_at, type = 'episode_scored'),
               argMaxIf(status, emitted_at, type = 'episode_finished')) AS status,
            min(emitted_at) AS started_at,
            max(emitted_at) AS last_event_at,
            uniqExactIf(event_id, type = 'llm_call_recorded') AS num_calls,
            if(countIf(type = 'episode_scored') > 0,
               argMaxIf(num_transitions, emitted_at, type = 'episode_scored'), NULL) AS num_transitions,
            if(countIf(type = 'episode_scored' AND reward IS NOT NULL) > 0,
               argMaxIf(reward, emitted_at, type = 'episode_scored' AND reward IS NOT NULL),
               argMaxIf(reward, emitted_at, type IN ('episode_finished', 'reward_reported')
                        AND reward IS NOT NULL)) AS reward,
            if(countIf(weight_version >= 0 AND type IN ('llm_call_recorded', 'episode_scored')) > 0,
               minIf(weight_version, weight_version >= 0
                     AND type IN ('llm_call_recorded', 'episode_scored')), NULL) AS min_weight_version,
            if(countIf(weight_version >= 0 AND type IN ('llm_call_recorded', 'episode_scored')) > 0,
               maxIf(weight_version, weight_version >= 0
                     AND type IN ('llm_call_recorded', 'episode_scored')), NULL) AS max_weight_version,
            countIf(type = 'episode_scored') > 0 AS scored
        FROM {db}.events
        WHERE episode_id IN (SELECT DISTINCT episode_id FROM {db}.events WHERE {" AND ".join(inner)})
        GROUP BY episode_id
        {"HAVING " + " AND ".join(having) if having else ""}
        ORDER BY started_at DESC, episode_id
        LIMIT {{limit:UInt64}} OFFSET {{offset:UInt64}}
    """
    return sql, params


def scored_page(
    db: str, f: EpisodeFilter, after: tuple[datetime, str] | None, page: int, latest_per_episode: bool
) -> tuple[str, Params]:
    """One page of ``EpisodeScored`` payloads in (emitted_at, event_id) order, keyset-paginated."""
    params: Params = {"page": page}
    conds = ["type = 'episode_scored'", *_time_conds(f.since, f.until, params)]
    for column, value in (
        ("tenant", f.tenant),
        ("group_id", f.group_id),
        ("task_id", f.task_id),
        ("source", f.source),
        ("status", f.status),
    ):
        if value is not None:
            conds.append(f"{column} = {{{column}:String}}")
            params[column] = value
    _bind(conds, params, "task_id LIKE {task_like:String}", "task_like", f.task_id_like)
    if f.episode_ids is not None:
        conds.append("episode_id IN {episode_ids:Array(String)}")
        params["episode_ids"] = list(f.episode_ids)
    _bind(conds, params, "reward >= {min_reward:Float64}", "min_reward", f.min_reward)
    _bind(conds, params, "reward <= {max_reward:Float64}", "max_reward", f.max_reward)
    _bind(conds, params, "weight_version >= {min_wv:Int64}", "min_wv", f.min_weight_version)
    _bind(
        conds,
        params,
        "weight_version <= {max_wv:Int64} AND weight_version >= 0",
        "max_wv",
        f.max_weight_version,
    )
    where = " AND ".join(conds)
    # Choose the page on the small columns, then read only its payloads (the IN becomes a PREWHERE).
    inner = f"SELECT emitted_at, event_id, episode_id FROM {db}.events WHERE {where}"
    if latest_per_episode:
        inner += " ORDER BY emitted_at DESC, event_id DESC LIMIT 1 BY episode_id"
    else:
        inner += " ORDER BY emitted_at, event_id LIMIT 1 BY event_id"
    after_cond = ""
    if after is not None:
        after_cond = "WHERE (emitted_at, event_id) > ({after_at:DateTime64(3, 'UTC')}, {after_id:String})"
        params["after_at"], params["after_id"] = after
    page_ids = (
        f"SELECT event_id FROM ({inner}) {after_cond} ORDER BY emitted_at, event_id LIMIT {{page:UInt64}}"
    )
    sql = f"""
        SELECT emitted_at, event_id, payload FROM {db}.events
        WHERE {where} AND event_id IN ({page_ids})
        ORDER BY emitted_at, event_id
        LIMIT 1 BY event_id
    """
    return sql, params


def calls_page(db: str, f: CallFilter, after: tuple[str, int, str] | None, page: int) -> tuple[str, Params]:
    """One page of ``LLMCallRecorded`` payloads in (episode_id, call_seq, event_id) order."""
    params: Params = {"page": page}
    conds = ["type = 'llm_call_recorded'", *_time_conds(f.since, f.until, params)]
    _bind(conds, params, "tenant = {tenant:String}", "tenant", f.tenant)
    _bind(conds, params, "source = {source:String}", "source", f.source)
    if f.episode_ids is not None:
        conds.append("episode_id IN {episode_ids:Array(String)}")
        params["episode_ids"] = list(f.episode_ids)
    _bind(conds, params, "weight_version >= {min_wv:Int64}", "min_wv", f.min_weight_version)
    _bind(conds, params, "weight_version <= {max_wv:Int64}", "max_wv", f.max_weight_version)
    if f.token_faithful_only:
        conds.append("token_faithful = 1")
    if after is not None:
        conds.append("(episode_id, call_seq, event_id) > ({a_ep:String}, {a_seq:Int32}, {a_id:String})")
        params["a_ep"], params["a_seq"], params["a_id"] = after
    sql = f"""
        SELECT episode_id, call_seq, event_id, payload FROM {db}.events
        WHERE {" AND ".join(conds)}
        ORDER BY episode_id, call_seq, event_id
        LIMIT 1 BY event_id
        LIMIT {{page:UInt64}}
    """
    return sql, params


_BUCKET_FN = {"minute": "toStartOfMinute", "hour": "toStartOfHour", "day": "toStartOfDay"}


# The latest feedback of a production session is positive when its rating is > 0, or, without a
# rating, when its value reaches the success threshold (``stats`` and the training view's trends).
FEEDBACK_BY_EPISODE = """
    SELECT
        episode_id,
        1 AS has_feedback,
        argMax(
            if(JSONExtract(payload, 'rating', 'Nullable(Int64)') IS NOT NULL,
               JSONExtract(payload, 'rating', 'Nullable(Int64)') > 0,
               ifNull(reward >= {{thr:Float64}}, 0)),
            emitted_at) AS positive
    FROM {db}.events
    WHERE type = 'reward_reported' AND JSONExtractString(payload, 'origin') = 'feedback'
    GROUP BY episode_id
"""


def stats(
    db: str,
    since: datetime | None,
    until: datetime | None,
    bucket: Bucket,
    success_threshold: float,
    *,
    policy: str | None = None,
    by_policy: bool = False,
) -> tuple[str, Params]:
    """Scored episodes per time bucket (one row per episode, duplicates absorbed).

    An episode lands in the bucket of its first score (for a production session: when it ended) and
    counts with its latest score (a re-score after late feedback replaces the reward, not the time).
    Production columns: ``feedback_rate`` is the share of the bucket's production sessions with any
    feedback (``RewardReported`` with origin ``feedback``, at any time); ``thumbs_up_rate`` the share of
    those whose latest feedback is positive (a rating > 0, or, without a rating, a score ≥ threshold).

    With a policy map: ``policy`` keeps the episodes with a call served by that policy's adapter (the
    calls' ``adapter`` column), and ``by_policy`` gives one row per bucket and policy (``''``: episodes
    no adapter served, the base); an episode with calls of two policies counts in both. The weight
    version columns are then the adapter's versions (its calls' ``adapter_version``), not the base's.
    """
    params: Params = {"thr": success_threshold}
    per_policy = by_policy or policy is not None
    policy_cols, policy_join, policy_group = "", "", ""
    version = "s_version"
    if per_policy:
        call_conds = ["type = 'llm_call_recorded'", "episode_id != ''"]
        if policy is not None:
            call_conds.append("adapter = {policy:String}")
            params["policy"] = policy
        else:
            call_conds.append("adapter != ''")
        kind = "INNER" if policy is not None else "LEFT"
        policy_cols, policy_group = "policy,", ", policy"
        policy_join = f"""
        {kind} JOIN (
            SELECT episode_id, adapter AS policy, maxOrNullIf(adapter_version, adapter_version >= 0) AS p_version
            FROM {db}.events WHERE {" AND ".join(call_conds)}
            GROUP BY episode_id, adapter
        ) AS policies USING (episode_id)"""
        version = "if(policy = '', s_version, ifNull(p_version, -1))"
    conds = ["type = 'episode_scored'", "source != 'replay'", *_time_conds(since, until, params)]
    fn = _BUCKET_FN[bucket]
    prod = "s_source = 'production'"
    sql = f"""
        SELECT
            toDateTime64({fn}(first_at), 3, 'UTC') AS bucket,
            {policy_cols}
            count() AS episodes,
            avgOrNull(s_reward) AS mean_reward,
            if(countIf(s_reward IS NOT NULL) > 0,
               countIf(s_reward >= {{thr:Float64}}) / countIf(s_reward IS NOT NULL), NULL) AS success_rate,
            countIf(s_status = 'ok') / count() AS ok_rate,
            avg(greatest(s_calls, 0)) AS mean_calls,
            avg(greatest(s_transitions, 0)) AS mean_transitions,
            avgOrNullIf({version}, {version} >= 0) AS mean_weight_version,
            maxOrNullIf({version}, {version} >= 0) AS max_weight_version,
            countIf({prod}) AS production_sessions,
            if(countIf({prod}) > 0, countIf({prod} AND has_feedback = 1) / countIf({prod}), NULL)
                AS feedback_rate,
            if(countIf({prod} AND has_feedback = 1) > 0,
               countIf({prod} AND has_feedback = 1 AND positive = 1) / countIf({prod} AND has_feedback = 1),
               NULL) AS thumbs_up_rate
        FROM (
            SELECT
                episode_id,
                min(emitted_at) AS first_at,
                argMax(reward, emitted_at) AS s_reward,
                argMax(status, emitted_at) AS s_status,
                argMax(source, emitted_at) AS s_source,
                argMax(num_calls, emitted_at) AS s_calls,
                argMax(num_transitions, emitted_at) AS s_transitions,
                argMax(weight_version, emitted_at) AS s_version
            FROM {db}.events WHERE {" AND ".join(conds)}
            GROUP BY episode_id
        ) AS scored
        LEFT JOIN ({FEEDBACK_BY_EPISODE.format(db=db)}) AS feedback USING (episode_id){policy_join}
        GROUP BY bucket{policy_group} ORDER BY bucket{policy_group}
    """
    return sql, params


def counts(db: str) -> tuple[str, Params]:
    return f"SELECT type, uniqExact(event_id) AS n FROM {db}.events GROUP BY type ORDER BY type", {}


def task_history(db: str, since: datetime | None, groups_per_task: int) -> tuple[str, Params]:
    """Per training task, its last ``groups_per_task`` live groups' rewards (each episode's latest score),
    oldest group first: what ``trainer.curriculum.SignalCurriculum`` reads as ``history``."""
    params: Params = {"keep": groups_per_task}
    conds = [
        "type = 'episode_scored'",
        "source = 'live'",
        "mode = 'train'",
        "task_id != ''",
        "group_id != ''",
        "reward IS NOT NULL",
        *_time_conds(since, None, params),
    ]
    sql = f"""
        SELECT task_id, arraySlice(arrayMap(g -> g.2, arraySort(g -> g.1, groupArray((g_at, rewards)))), -{{keep:UInt32}})
        FROM (
            SELECT task_id, group_id, max(ep_at) AS g_at, groupArray(ep_reward) AS rewards
            FROM (
                SELECT task_id, group_id, episode_id, max(emitted_at) AS ep_at, argMax(reward, emitted_at) AS ep_reward
                FROM {db}.events WHERE {" AND ".join(conds)}
                GROUP BY task_id, group_id, episode_id
            )
            GROUP BY task_id, group_id
        )
        GROUP BY task_id
    """
    return sql, params
