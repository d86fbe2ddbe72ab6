"""Built-in scorers and the user-function scorer: an episode → a reward.

A scorer returns a :class:`Score`. It raises :class:`ScorerError` (or anything else) when it cannot
score; the service then publishes the episode as failed-to-score with the error — never drops it.

Exceptions:
    ScorerError         bad options, a gold query that fails, a user function returning a non-number
     └── UnknownScorer  the task names a scorer that does not exist
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import JsonValue

from reward_service.state import EpisodeRecord
from schemas import CallChoice, RewardOrigin, ScorerSpec
from schemas.scorers import (
    AgentOptions,
    ExactOptions,
    NumericOptions,
    RegexOptions,
    ScorerOptions,
    SqlOptions,
    ToolCallOptions,
)

OptionsT = TypeVar("OptionsT", bound=ScorerOptions)


class ScorerError(Exception):
    pass


class UnknownScorer(ScorerError):
    pass


@dataclass(frozen=True, slots=True)
class Score:
    reward: float | None
    source: str  # agent | filled | exact | numeric | regex | sql | function | judge | feedback | unscored
    note: str = ""


ScorerFn = Callable[[EpisodeRecord, ScorerSpec], Awaitable[Score]]

# ----------------------------------------------------------------------------------- the answer


def last_message_text(record: EpisodeRecord) -> str | None:
    """The content of the last call's first choice (what the model said last)."""
    calls = record.ordered_calls()
    for call in reversed(calls):
        for choice in sorted(call.choices, key=lambda c: c.index):
            text = _choice_text(choice)
            if text:
                return text
    return None


def predicted(
    record: EpisodeRecord, spec: ScorerSpec, *, prefer: tuple[str, ...] = ("answer",)
) -> str | None:
    """The agent's answer as text: ``output[field]`` (``options.field``, else the first of ``prefer``
    present), the output itself, or — when the agent returned nothing — the last model message."""
    output: JsonValue = record.finished.output if record.finished is not None else None
    field = _options(spec, ScorerOptions).field
    if isinstance(output, dict):
        keys = [field] if field is not None else list(prefer)
        for key in keys:
            if key in output:
                output = output[key]
                break
    if output is None:
        return last_message_text(record)
    return output if isinstance(output, str) else json.dumps(output)


def _answer(record: EpisodeRecord) -> JsonValue:
    task = record.started.task if record.started is not None else None
    return task.answer if task is not None else None


def _options(spec: ScorerSpec, kind: type[OptionsT]) -> OptionsT:
    """``spec``'s options as ``kind`` (checked when the task was parsed; a mismatch is a ScorerError)."""
    try:
        return spec.options_as(kind)
    except ValueError as exc:
        raise ScorerError(str(exc)) from None


# ------------------------------------------------------------------------------------- scorers


async def score_agent(record: EpisodeRecord, spec: ScorerSpec, fill: float = 0.0) -> Score:
    """The agent's own reward: the last one reported wins (gateway route, then the final JSON line)."""
    value: float | None = None
    for reward in record.rewards:
        if reward.origin is RewardOrigin.agent and reward.call_seq is None and reward.value is not None:
            value = reward.value
    if record.finished is not None and record.finished.reported_reward is not None:
        value = record.finished.reported_reward
    if value is not None:
        return Score(value, "agent")
    filled = _options(spec, AgentOptions).fill
    return Score(fill if filled is None else filled, "filled", "no reward reported")


def _candidates(answer: JsonValue) -> list[str]:
    values = answer if isinstance(answer, list) else [answer]
    return [v if isinstance(v, str) else json.dumps(v) for v in values if v is not None]


async def score_exact(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    options = _options(spec, ExactOptions)
    got = predicted(record, spec)
    gold = _candidates(options.answer if options.answer is not None else _answer(record))
    if not gold:
        raise ScorerError("exact: the task has no answer")
    fold = options.ignore_case

    def norm(s: str) -> str:
        s = " ".join(s.split())
        return s.casefold() if fold else s

    ok = got is not None and norm(got) in {norm(g) for g in gold}
    return Score(1.0 if ok else 0.0, "exact", _verdict(ok, got, gold))


def _verdict(ok: bool, got: str | None, gold: list[str]) -> str:
    """The reason in words (prompt optimisation reflects on it): what was expected and what came."""
    if ok:
        return f"correct: {got!r}"[:2000]
    want = " or ".join(repr(g) for g in gold[:3])
    return (f"expected {want}, got {got!r}" if got else f"expected {want}, got no answer")[:2000]


_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _parse_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


async def score_numeric(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    options = _options(spec, NumericOptions)
    gold_raw = options.answer if options.answer is not None else _answer(record)
    gold = _parse_number(gold_raw if isinstance(gold_raw, str) else json.dumps(gold_raw))
    if gold is None:
        raise ScorerError("numeric: the task's answer is not a number")
    got_text = predicted(record, spec)
    got = _parse_number(got_text) if got_text is not None else None
    ok = got is not None and math.isclose(got, gold, rel_tol=options.rel_tolerance, abs_tol=options.tolerance)
    return Score(1.0 if ok else 0.0, "numeric", _verdict(ok, got_text, [str(gold_raw)]))


async def score_regex(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    options = _options(spec, RegexOptions)
    pattern = options.pattern if options.pattern is not None else _answer(record)
    if not isinstance(pattern, str):
        raise ScorerError("regex: options.pattern (or the task's answer) must be a string")
    flags = re.IGNORECASE if options.ignore_case else 0
    try:
        compiled = re.compile(pattern, flags)
    except re.error as exc:
        raise ScorerError(f"regex: bad pattern: {exc}") from exc
    got = predicted(record, spec)
    match = compiled.fullmatch if options.full else compiled.search
    return Score(1.0 if got is not None and match(got) else 0.0, "regex")


# ------------------------------------------------------------------------------------ SQL match


def _run_sql(db: str, sql: str, timeout_s: float) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, check_same_thread=False)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _strip_sql(text: str) -> str:
    fenced = re.search(r"```(?:sql)?\s*(.*?)```", text, re.DOTALL | re.IGNORECASE)
    return (fenced.group(1) if fenced else text).strip().rstrip(";")


async def score_sql(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    """Execution match: predicted and gold SQL on the task's SQLite database, result rows compared by
    value (Spider's execution accuracy, Yu et al., 2018): as multisets, or in order when ``ordered`` is
    true or (the default, ``"auto"``) the gold query has an ``ORDER BY``."""
    options = _options(spec, SqlOptions)
    db: JsonValue = options.db
    task = record.started.task if record.started is not None else None
    if db is None and task is not None:
        db = task.metadata.get("db")
    gold = options.gold if options.gold is not None else _answer(record)
    if not isinstance(db, str) or not isinstance(gold, str):
        raise ScorerError("sql: needs options.db (or task metadata 'db') and a gold query as the answer")
    timeout_s = options.timeout_s
    try:
        want = await asyncio.to_thread(_run_sql, db, _strip_sql(gold), timeout_s)
    except sqlite3.Error as exc:
        raise ScorerError(f"sql: the gold query failed: {exc}") from exc
    got_text = predicted(record, spec, prefer=("sql", "query", "answer"))
    if not got_text:
        return Score(0.0, "sql", "no predicted query")
    try:
        got = await asyncio.to_thread(_run_sql, db, _strip_sql(got_text), timeout_s)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return Score(0.0, "sql", f"predicted query failed: {exc}")
    ordered = _has_order_by(gold) if options.ordered == "auto" else options.ordered
    rows_got, rows_want = _rows(got), _rows(want)
    same = rows_got == rows_want if ordered else Counter(rows_got) == Counter(rows_want)
    return Score(1.0 if same else 0.0, "sql")


_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _has_order_by(sql: str) -> bool:
    """Whether the gold query orders its result (as Spider's evaluation decides): then row order counts."""
    return bool(_ORDER_BY.search(_QUOTED.sub("''", sql)))


def _value(v: Any) -> Any:
    """One cell, compared by value: ``2`` and ``2.0`` are the same number (``AVG`` vs an integer column),
    floats agree to 9 significant digits (summation order), ``NULL`` equals only ``NULL``."""
    if isinstance(v, float) and math.isfinite(v):
        if v.is_integer():
            return int(v)
        return float(f"{v:.9g}")
    return v


def _rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(_value(v) for v in row) for row in rows]


# ------------------------------------------------------------------------------------ tool calls


def _tool_calls(record: EpisodeRecord) -> list[tuple[str, Any]]:
    """The tool calls of the episode's last answered call (its first choice): (name, parsed arguments)."""
    for call in reversed(record.ordered_calls()):
        if call.status_code != 200 or not call.choices:
            continue
        message = call.choices[0].message
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        out: list[tuple[str, Any]] = []
        for tc in calls if isinstance(calls, list) else []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                continue
            raw = fn.get("arguments")
            try:
                args = json.loads(raw) if isinstance(raw, str) and raw else {}
            except ValueError:
                args = None  # not JSON: matches nothing
            out.append((str(fn.get("name") or ""), args))
        return out
    return []


def _std(text: str) -> str:
    """BFCL's string comparison: case, spaces and ``,./-_*^`` do not count."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower()


def _same(got: Any, want: Any) -> bool:
    """``got`` is ``want``: strings as BFCL compares them, an int where a float is wanted, lists item by
    item; a dict's values are lists of accepted values, as at the top level."""
    if isinstance(want, bool) or want is None:
        return got is want
    if isinstance(want, int | float):
        return not isinstance(got, bool) and isinstance(got, int | float) and float(got) == float(want)
    if isinstance(want, str):
        return isinstance(got, str) and _std(got) == _std(want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and _arguments_match(got, want)
    return False


def _arguments_match(got: dict[str, Any], accepted: dict[str, Any]) -> bool:
    return _arguments_score(got, accepted) == 1.0


def _arguments_score(got: dict[str, Any], accepted: dict[str, Any]) -> float:
    """The share of the function's parameters given as accepted (left out where that is allowed); 0 when
    a parameter the function does not take is given."""
    if set(got) - set(accepted):
        return 0.0
    if not accepted:
        return 1.0
    right = 0
    for name, values in accepted.items():
        options = values if isinstance(values, list) else [values]
        if name not in got:
            right += "" in options  # optional, left out
        else:
            right += any(_same(got[name], v) for v in options if v != "")
    return right / len(accepted)


def _name(name: str) -> str:
    return name.replace(".", "_")  # tools are offered with "_" for "." (OpenAI's name pattern)


async def score_tool_call(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    options = _options(spec, ToolCallOptions)
    expected = options.answer if options.answer is not None else _answer(record)
    if (
        not isinstance(expected, list)
        or not expected
        or not all(
            isinstance(e, dict) and len(e) == 1 and isinstance(next(iter(e.values())), dict) for e in expected
        )
    ):
        raise ScorerError(
            "tool_call: the answer must be a list of {function: {parameter: [accepted values]}}"
        )
    calls: list[dict[str, Any]] = [e for e in expected if isinstance(e, dict)]
    got = _tool_calls(record)
    shown = [{name: args} for name, args in got]
    credit: list[float] = []
    for i, want in enumerate(calls):
        [(fn, accepted)] = want.items()
        if i >= len(got) or _name(got[i][0]) != _name(fn):
            credit.append(0.0)
            continue
        args = got[i][1]
        credit.append(0.5 + 0.5 * _arguments_score(args, accepted) if isinstance(args, dict) else 0.5)
    ok = len(got) == len(calls) and all(c == 1.0 for c in credit)
    want_text = f"expected {calls}, got {shown}" if shown else f"expected {calls}, got no tool call"
    note = (f"correct: {shown}" if ok else want_text)[:2000]
    if options.partial:
        extra = max(0, len(got) - len(calls))  # calls nobody asked for cost their share
        return Score(sum(credit) / (len(calls) + extra), "tool_call", note)
    return Score(1.0 if ok else 0.0, "tool_call", note)


# ------------------------------------------------------------------------------- user function


def _choice_text(choice: CallChoice) -> str:
    message = choice.message
    if isinstance(message, dict):
        content = message.get("content")
        if isinstance(content, str):
            return content
    return choice.text


def episode_view(record: EpisodeRecord) -> dict[str, Any]:
    """What a user scorer receives: plain JSON-ready data, no Flywheel types."""
    started, finished = record.started, record.finished
    return {
        "episode_id": record.episode_id,
        "task": started.task.model_dump(mode="json") if started and started.task else None,
        "status": finished.status.value if finished else None,
        "output": finished.output if finished else None,
        "error": finished.error if finished else None,
        "reported_reward": finished.reported_reward if finished else None,
        "calls": [
            {
                "call_seq": c.call_seq,
                "request": c.request,
                "response": c.response,
                "text": [_choice_text(ch) for ch in c.choices],
            }
            for c in record.ordered_calls()
        ],
        "rewards": [r.model_dump(mode="json") for r in record.rewards],
        "last_message": last_message_text(record),
    }


_FUNCTIONS: dict[str, Callable[..., Any]] = {}


def _load(ref: str) -> Callable[..., Any]:
    if ref not in _FUNCTIONS:
        module, sep, attr = ref.partition(":")
        if not sep:
            raise ScorerError(f"function: ref {ref!r} is not 'module:function'")
        try:
            fn: Any = importlib.import_module(module)
            for part in attr.split("."):
                fn = getattr(fn, part)
        except (ImportError, AttributeError) as exc:
            raise ScorerError(f"function: cannot load {ref!r}: {exc}") from exc
        _FUNCTIONS[ref] = fn
    return _FUNCTIONS[ref]


async def score_function(record: EpisodeRecord, spec: ScorerSpec) -> Score:
    if not spec.ref:
        raise ScorerError("function: ScorerSpec.ref must be 'module:function'")
    fn = _load(spec.ref)
    view = episode_view(record)
    value = await fn(view) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, view)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScorerError(f"function: {spec.ref} returned {value!r}, not a finite number")
    return Score(float(value), "function")


BUILTIN: dict[str, ScorerFn] = {
    "exact": score_exact,
    "numeric": score_numeric,
    "regex": score_regex,
    "sql": score_sql,
    "tool_call": score_tool_call,
    "function": score_function,
}
