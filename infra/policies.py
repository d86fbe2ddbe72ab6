"""The policy map: which calls train which LoRA adapter over one shared, frozen base.

``FLYWHEEL_POLICIES`` names the policies and what selects each one's calls, with the selectors selective
training already has (``reward_service/selection.py``): the model name the agent asked for, the tenant,
and a regular expression on the first system message. Two spellings::

    FLYWHEEL_POLICIES='writer,rewriter'        each name selects the calls that ask for that model name
    FLYWHEEL_POLICIES='{"acme": {"tenants": ["acme"]},
                        "critic": {"system_match": "^You are a critic"},
                        "writer": {"models": ["writer", "writer-v2"]}}'

A call belongs to the first policy (in the map's order) whose selectors all match it; a policy with no
selector at all matches every call (a catch-all: one shared adapter). A call no policy matches is served
by the base and trains nothing, since the base stays frozen while adapters are trained. No map (the
default): no adapters, and the trainer fine-tunes the whole model as it always did.

Who reads the map: the gateway picks the policy of each call, sends the call to the engine under the
policy's name (the adapter the engine serves under that name) and records ``LLMCallRecorded.adapter``
with the adapter's version; the reward service carries it into ``Transition.policy``; the trainer trains
one adapter per policy (:mod:`trainer.lora`, :mod:`trainer.policy_service`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PolicyMapError(ValueError):
    """The policy map's text is not a valid map (the message names the entry)."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    models: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()
    system_match: re.Pattern[str] | None = None

    def matches(self, model: str, tenant: str | None, system: str | None) -> bool:
        if self.models and model not in self.models:
            return False
        if self.tenants and (tenant or "") not in self.tenants:
            return False
        return self.system_match is None or (system is not None and bool(self.system_match.search(system)))


@dataclass(frozen=True, slots=True)
class PolicyMap:
    policies: tuple[PolicySpec, ...] = ()

    @classmethod
    def parse(cls, text: str) -> PolicyMap:
        """From ``FLYWHEEL_POLICIES``: ``"a,b"`` or a JSON object; raises :class:`PolicyMapError`."""
        text = text.strip()
        if not text:
            return cls()
        if not text.startswith("{"):
            names = [n.strip() for n in text.split(",") if n.strip()]
            return cls._build((name, {"models": [name]}) for name in names)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyMapError(f"the policy map is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise PolicyMapError("the policy map is an object: policy name -> selectors")
        return cls._build(raw.items())

    @classmethod
    def _build(cls, entries: Iterable[tuple[str, Any]]) -> PolicyMap:
        specs: list[PolicySpec] = []
        for name, sel in entries:
            if not _NAME.match(name):
                raise PolicyMapError(f"policy name {name!r}: letters, digits, '.', '_' or '-', at most 128")
            if any(s.name == name for s in specs):
                raise PolicyMapError(f"policy {name!r} is named twice")
            if not isinstance(sel, Mapping):
                raise PolicyMapError(
                    f"policy {name!r}: selectors are an object (models, tenants, system_match)"
                )
            unknown = set(sel) - {"models", "tenants", "system_match"}
            if unknown:
                raise PolicyMapError(f"policy {name!r}: unknown selector(s) {', '.join(sorted(unknown))}")
            pattern = sel.get("system_match") or None
            try:
                compiled = re.compile(pattern) if pattern is not None else None
            except (re.error, TypeError) as exc:
                raise PolicyMapError(
                    f"policy {name!r}: system_match is not a regular expression: {exc}"
                ) from exc
            specs.append(
                PolicySpec(name, _names(name, "models", sel), _names(name, "tenants", sel), compiled)
            )
        return cls(tuple(specs))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.policies]

    def __bool__(self) -> bool:
        return bool(self.policies)

    def policy_for(self, model: str, tenant: str | None, request: Mapping[str, Any] | str) -> str | None:
        """The policy of one call (its requested model, tenant, and request body), or None: the base."""
        system: str | None = None
        if any(s.system_match is not None for s in self.policies):
            system = system_prompt(request) if isinstance(request, str) else system_prompt_of(request)
        for spec in self.policies:
            if spec.matches(model, tenant, system):
                return spec.name
        return None


def _names(policy: str, key: str, sel: Mapping[str, Any]) -> frozenset[str]:
    value = sel.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyMapError(f"policy {policy!r}: {key} is a list of names")
    return frozenset(value)


def system_prompt(request: str) -> str | None:
    """The first system (or developer) message of a recorded chat request, as text."""
    try:
        body = json.loads(request)
    except json.JSONDecodeError:
        return None
    return system_prompt_of(body)


def system_prompt_of(body: object) -> str | None:
    """The first system (or developer) message of a parsed chat request body, as text."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None
