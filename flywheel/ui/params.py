"""The episode list's query string, read into an :class:`EpisodeFilter` and a page, or refused.

Every value is checked here, before any query runs, so a malformed filter (``reward_min=abc``,
``page=-1``, a ``since`` after ``until``) becomes a :class:`BadInput` (a 400 page), never a failed query.
The names are the form's field names; an empty value means "any".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from pydantic import ValidationError

from infra.eventlog.models import MAX_VERSION, EpisodeFilter
from infra.eventlog.timeparse import parse_when
from schemas import EpisodeSource, EpisodeStatus

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE = 100_000
FIELDS = (
    "source", "tenant", "task", "status", "reward_min", "reward_max", "version_min", "version_max",
    "since", "until", "page_size",
)  # fmt: skip
SOURCES = tuple(s.value for s in EpisodeSource)
STATUSES = tuple(s.value for s in EpisodeStatus)


class BadInput(ValueError):
    """A query value the view cannot use; ``param`` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One page of the episode list: the filter (its limit one more than the page, to see a next page)."""

    filter: EpisodeFilter
    page: int
    page_size: int
    values: dict[str, str]  # the non-empty form values as given, to rebuild links and the form

    def link(self, page: int) -> str:
        return "?" + urlencode({**self.values, "page": str(page)})


def _int(raw: str, name: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name} must be a whole number, not {raw!r}", name) from None
    if not low <= value <= high:
        raise BadInput(f"{name} must be between {low} and {high}, not {value}", name)
    return value


def _float(raw: str, name: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"{name} must be a number, not {raw!r}", name) from None
    if not math.isfinite(value) or abs(value) > 1e12:
        raise BadInput(f"{name} must be a finite number within ±1e12, not {raw!r}", name)
    return value


def _choice(raw: str, name: str, allowed: tuple[str, ...]) -> str:
    if raw not in allowed:
        raise BadInput(f"{name} must be one of {', '.join(allowed)}, not {raw!r}", name)
    return raw


def _like(text: str) -> str:
    """A substring match on ``task_id``: the text's own LIKE wildcards are escaped."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """Read the list's query string; :class:`BadInput` names the first value it cannot use."""
    values = {k: query[k].strip() for k in FIELDS if query.get(k, "").strip()}
    if any(len(v) > 256 for v in values.values()):
        raise BadInput("a filter value is longer than 256 characters")
    page = _int(query.get("page", "1").strip() or "1", "page", 1, MAX_PAGE)
    size = _int(values.get("page_size", str(PAGE_SIZE)), "page_size", 1, MAX_PAGE_SIZE)
    fields: dict[str, object] = {}
    if "source" in values:
        fields["source"] = _choice(values["source"], "source", SOURCES)
    if "status" in values:
        fields["status"] = _choice(values["status"], "status", STATUSES)
    if "tenant" in values:
        fields["tenant"] = values["tenant"]
    if "task" in values:
        fields["task_id_like"] = _like(values["task"])
    for name, key in (("reward_min", "min_reward"), ("reward_max", "max_reward")):
        if name in values:
            fields[key] = _float(values[name], name)
    for name, key in (("version_min", "min_weight_version"), ("version_max", "max_weight_version")):
        if name in values:
            fields[key] = _int(values[name], name, 0, MAX_VERSION)
    for name in ("since", "until"):
        if name in values:
            try:
                fields[name] = parse_when(values[name])
            except ValueError as exc:
                raise BadInput(f"{name}: {exc}", name) from None
    try:
        f = EpisodeFilter.model_validate({**fields, "limit": size + 1, "offset": (page - 1) * size})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadInput(str(first["msg"]).removeprefix("Value error, ")) from None
    return ListQuery(filter=f, page=page, page_size=size, values=values)
