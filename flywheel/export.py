"""Dataset export from the event log: chat SFT data and token-level RL data, as JSONL or Parquet.

``sft`` — one row per recorded chat call, in the conversational format TRL's ``SFTTrainer`` reads:
``messages`` (the request's messages followed by the assistant message the model returned, tool calls
included), ``tools`` when the agent offered tools, plus ``episode_id``, ``call_seq``, ``model``,
``weight_version``, ``prompt_version`` and the episode's ``reward`` when it was scored. Where the
gateway substituted an optimised prompt (``prompt_substitutions``), ``messages`` hold the substituted
text: what the model saw, the text its recorded ids encode. ``--min-reward`` keeps only calls
of episodes that scored at least that much (rejection-sampling fine-tuning). Calls that failed, were
not chat calls, or have no assistant message are skipped with a reason.

``rl`` — one row per transition of each scored episode: ``prompt_ids``, ``response_ids``,
``response_mask``, ``response_logprobs`` (behaviour logprobs), ``reward_score``, ``num_turns``, the
names verl's agent-loop output uses (``AgentLoopOutput``), with ``uid`` = the GRPO group (verl groups
advantages by ``uid``), ``weight_version``, ``prompt_version``, ``logprobs_mode``, ``source``, ``mode`` (train/val), ``episode_id``, ``task_id``.

With a policy map both carry ``policy`` (the LoRA adapter that served the call / the transition's policy;
null for the base; ``weight_version`` is then the adapter's version), and ``ExportFilter.policy`` keeps
one policy's rows.

In Parquet, ``messages`` is a list of structs (role, content, name, tool_call_id, tool_calls) and
``tools`` a JSON string (tool schemas have no fixed shape); in JSONL both are plain JSON. Rows are
written in batches, so an export never holds the whole log in memory.

``flywheel export --merged`` (not a dataset) is :mod:`flywheel.merged`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from infra.eventlog.models import CallFilter, EpisodeFilter
from schemas import EpisodeScored, LLMCallRecorded

Kind = Literal["sft", "rl"]
Format = Literal["jsonl", "parquet"]
Row = dict[str, Any]
BATCH = 1000
MAX_EPISODES = 1_000_000


class ExportSource(Protocol):
    """The event store's reads that export needs (``infra.eventlog.store``)."""

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]: ...

    def select_calls(self, f: CallFilter) -> Iterator[LLMCallRecorded]: ...


@dataclass(frozen=True, slots=True)
class ExportFilter:
    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    min_reward: float | None = None
    source: str | None = None
    policy: str | None = None  # one policy's (LoRA adapter's) rows
    limit: int | None = None  # rows


@dataclass
class ExportReport:
    kind: Kind
    format: Format
    path: str
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "format": self.format,
            "path": self.path,
            "rows": self.rows,
            "skipped": dict(sorted(self.skipped.items())),
        }


# ------------------------------------------------------------------------------------- SFT

_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("name", pa.string()),
        ("tool_call_id", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
    ]
)
SFT_SCHEMA = pa.schema(
    [
        ("messages", pa.list_(_MESSAGE)),
        ("tools", pa.string()),
        ("episode_id", pa.string()),
        ("call_seq", pa.int32()),
        ("model", pa.string()),
        ("weight_version", pa.int64()),
        ("prompt_version", pa.string()),
        ("reward", pa.float64()),
        ("tenant", pa.string()),
        ("source", pa.string()),
        ("policy", pa.string()),
    ]
)

RL_SCHEMA = pa.schema(
    [
        ("uid", pa.string()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("source", pa.string()),
        ("mode", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("reward_score", pa.float64()),
        ("num_turns", pa.int32()),
        ("call_seqs", pa.list_(pa.int32())),
        ("weight_version", pa.int64()),
        ("prompt_version", pa.string()),
        ("logprobs_mode", pa.string()),
        ("policy", pa.string()),
    ]
)


def _text(content: Any) -> str | None:
    """Message content as text: strings as they are, a list of parts joined by their text."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _message(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
        return None
    out: dict[str, Any] = {"role": raw["role"], "content": raw.get("content")}
    for key in ("name", "tool_call_id"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    calls = raw.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type", "function"),
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments"),
                },
            }
            for c in calls
            if isinstance(c, dict)
        ]
    return out


def sft_row(call: LLMCallRecorded, reward: float | None) -> tuple[Row | None, str | None]:
    """One SFT row for ``call``, or the reason it has none."""
    if call.endpoint != "chat.completions":
        return None, "not_chat"
    if call.error is not None or call.status_code >= 400:
        return None, "failed_call"
    try:
        request = orjson.loads(call.request)
    except orjson.JSONDecodeError:
        return None, "bad_request_json"
    raw_messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(raw_messages, list) or not raw_messages:
        return None, "no_messages"
    messages = [_message(m) for m in raw_messages]
    if any(m is None for m in messages):
        return None, "bad_message"
    for sub in call.prompt_substitutions:  # what the model saw, not what the agent sent
        i = sub.message_index
        msg = messages[i] if i is not None and i < len(messages) else None
        if msg is not None:
            text = _text(msg.get("content")) or ""
            # a system component replaced the whole message, a marked span its own part of it
            span = sub.original != text and sub.original in text
            msg["content"] = text.replace(sub.original, sub.substituted, 1) if span else sub.substituted
    answer = _message(call.choices[0].message) if call.choices else None
    if answer is None and call.choices:
        answer = {"role": "assistant", "content": call.choices[0].text}
    if answer is None or (not answer.get("content") and not answer.get("tool_calls")):
        return None, "no_answer"
    tools = request.get("tools")
    return {
        "messages": [*messages, answer],
        "tools": tools if isinstance(tools, list) and tools else None,
        "episode_id": call.episode_id,
        "call_seq": call.call_seq,
        "model": call.model,
        "weight_version": call.adapter_version if call.adapter is not None else call.weight_version,
        "prompt_version": call.prompt_version,
        "reward": reward,
        "tenant": call.tenant,
        "source": call.source.value,
        "policy": call.adapter,
    }, None


def _scored_rewards(source: ExportSource, f: ExportFilter) -> dict[str, float | None]:
    episodes = source.select_scored_episodes(
        EpisodeFilter(
            since=f.since, until=f.until, tenant=f.tenant, min_reward=f.min_reward, limit=MAX_EPISODES
        )
    )
    return {e.episode_id: e.reward for e in episodes}


def sft_rows(source: ExportSource, f: ExportFilter, skipped: Counter[str]) -> Iterator[Row]:
    rewards = _scored_rewards(source, f)
    if f.min_reward is not None and not rewards:
        return
    calls = source.select_calls(
        CallFilter(
            since=f.since,
            until=f.until,
            tenant=f.tenant,
            source=f.source,
            episode_ids=sorted(rewards) if f.min_reward is not None else None,
        )
    )
    for call in calls:
        if f.policy is not None and call.adapter != f.policy:
            skipped["other_policy"] += 1
            continue
        row, reason = sft_row(call, rewards.get(call.episode_id))
        if row is None:
            skipped[reason or "unknown"] += 1
            continue
        yield row


# -------------------------------------------------------------------------------------- RL


def rl_rows(source: ExportSource, f: ExportFilter, skipped: Counter[str]) -> Iterator[Row]:
    episodes = source.select_scored_episodes(
        EpisodeFilter(
            since=f.since, until=f.until, tenant=f.tenant, min_reward=f.min_reward, limit=MAX_EPISODES
        )
    )
    for e in episodes:
        if f.source is not None and e.source.value != f.source:
            skipped["source"] += 1
            continue
        if not e.transitions:
            skipped[f"no_transitions:{e.unusable_reason or 'unknown'}"] += 1
            continue
        for t in e.transitions:
            if f.policy is not None and t.policy != f.policy:
                skipped["other_policy"] += 1
                continue
            if len(t.behaviour_logprobs) != len(t.response_ids):
                skipped["no_logprobs"] += 1
                continue
            yield {
                "uid": e.group_id,
                "episode_id": e.episode_id,
                "task_id": e.task_id,
                "source": e.source.value,
                "mode": e.mode.value,
                "prompt_ids": t.prompt_ids,
                "response_ids": t.response_ids,
                "response_mask": t.response_mask,
                "response_logprobs": t.behaviour_logprobs,
                "reward_score": t.reward,
                "num_turns": max(1, len(t.call_seqs)),
                "call_seqs": t.call_seqs,
                "weight_version": t.weight_version,
                "prompt_version": t.prompt_version,
                "logprobs_mode": t.logprobs_mode.value,
                "policy": t.policy,
            }


# ----------------------------------------------------------------------------------- write


def _parquet_ready(kind: Kind, row: Row) -> Row:
    if kind == "sft":
        row = dict(row)
        row["tools"] = orjson.dumps(row["tools"]).decode() if row["tools"] is not None else None
        row["messages"] = [{**m, "content": _text(m.get("content"))} for m in row["messages"]]
    return row


def _batches(rows: Iterable[Row], limit: int | None) -> Iterator[list[Row]]:
    limited = islice(rows, limit) if limit is not None else iter(rows)
    while batch := list(islice(limited, BATCH)):
        yield batch


def export(
    source: ExportSource,
    path: Path,
    *,
    kind: Kind,
    fmt: Format,
    flt: ExportFilter | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> ExportReport:
    """Write the ``kind`` dataset to ``path`` in ``fmt``; the file is complete only when this returns."""
    flt = flt or ExportFilter()
    report = ExportReport(kind=kind, format=fmt, path=str(path))
    rows = sft_rows(source, flt, report.skipped) if kind == "sft" else rl_rows(source, flt, report.skipped)
    schema = SFT_SCHEMA if kind == "sft" else RL_SCHEMA
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        if fmt == "jsonl":
            with partial.open("wb") as out:
                for batch in _batches(rows, flt.limit):
                    out.write(b"".join(orjson.dumps(r) + b"\n" for r in batch))
                    report.rows += len(batch)
                    if on_rows is not None:
                        on_rows(len(batch))
        else:
            with pq.ParquetWriter(partial, schema) as writer:
                for batch in _batches(rows, flt.limit):
                    table = pa.Table.from_pylist([_parquet_ready(kind, r) for r in batch], schema=schema)
                    writer.write_table(table)
                    report.rows += len(batch)
                    if on_rows is not None:
                        on_rows(len(batch))
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return report
