"""Prompt components: the gateway substitutes the active optimised prompt before the engine sees a call.

A *component* (``schemas.PromptComponent``) is a named piece of the agent's prompt Flywheel may
replace, so an agent's prompts can be optimised with no change to the agent (docs/architecture.md, flow 6):

* ``match="system"`` (the default): a ``system``/``developer`` chat message whose text equals the
  component's ``original`` (compared without surrounding whitespace) — the gateway sees the agent's
  original in every call, so nothing needs marking;
* ``match="span"``: a span the agent marked ``[[flywheel:<name>]]…[[/flywheel:<name>]]`` in any
  message (or a completions prompt). Marked spans always reach the model without their markers: the
  marked text when no version is active, the candidate's text when one is.

:func:`substitute` is the pure part: the body the engine gets and every change made, original and
substituted text (``PromptSubstitution``, recorded on ``LLMCallRecorded``). The engine tokenises the
substituted body, so the recorded prompt ids are what the model saw (token faithfulness holds).

:class:`PromptStore` holds the active version (set by ``PromptVersionRequested`` on
``flywheel.control``, kept in ``<data_dir>/gateway/prompt.json`` across restarts) and *pins* a version
per GRPO group (per episode when it has no group) at the group's first call: a version activated while
a group is being sampled serves only groups that start after it, so a group never mixes prompt
versions (its advantages compare like with like). Pins live in this gateway's memory: a group's in a
map bounded by count (least recently used out), an episode's own on its state, forgotten with it.
Replicas each pin their own, which keeps a group whole as long as its episodes go through one gateway,
as the embedded stack and one-gateway deployments do.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.episodes.registry import EpisodeState
from infra.logging import get_logger
from schemas import PromptComponent, PromptSubstitution, PromptVersionRequested

log = get_logger("gateway.prompts")

MARK = "[[flywheel:"
_SPAN = re.compile(r"\[\[flywheel:([A-Za-z0-9_.\-]+)\]\](.*?)\[\[/flywheel:\1\]\]", re.DOTALL)
_SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class ActivePrompt:
    version: str
    components: tuple[PromptComponent, ...]

    def system(self) -> dict[str, PromptComponent]:
        return {c.original.strip(): c for c in self.components if c.match == "system"}

    def spans(self) -> dict[str, PromptComponent]:
        return {c.name: c for c in self.components if c.match == "span"}


@dataclass(frozen=True, slots=True)
class Substituted:
    data: dict[str, Any]  # the body for the engine (the agent's own when nothing changed)
    version: str | None  # stamped on the call when at least one component was substituted
    changes: list[PromptSubstitution]


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None  # images, audio, ...: never rewritten


def _spans(text: str, active: ActivePrompt | None) -> tuple[str, list[tuple[str, str, str]]]:
    """``text`` with every marked span replaced; and (component, original span, substituted) each."""
    spans = active.spans() if active is not None else {}
    changes: list[tuple[str, str, str]] = []

    def replace(m: re.Match[str]) -> str:
        comp = spans.get(m.group(1))
        new = comp.text if comp is not None else m.group(2)
        changes.append((m.group(1), m.group(0), new))
        return new

    return _SPAN.sub(replace, text), changes


def substitute(data: dict[str, Any], active: ActivePrompt | None, raw: bytes | None = None) -> Substituted:
    """The request body with ``active``'s components substituted (``data`` itself is never mutated)."""
    has_marks = MARK.encode() in raw if raw is not None else True
    if active is None and not has_marks:
        return Substituted(data, None, [])
    system = active.system() if active is not None else {}
    changes: list[PromptSubstitution] = []
    used = False
    body = data
    messages = data.get("messages")
    if isinstance(messages, list):
        out: list[Any] = []
        for i, msg in enumerate(messages):
            text = _text(msg.get("content")) if isinstance(msg, dict) else None
            if text is None:
                out.append(msg)
                continue
            new = text
            comp = system.get(text.strip()) if msg.get("role") in _SYSTEM_ROLES else None
            if comp is not None:
                new = comp.text
                changes.append(
                    PromptSubstitution(component=comp.name, message_index=i, original=text, substituted=new)
                )
                used = True
            elif has_marks:
                new, found = _spans(text, active)
                for name, old, sub in found:
                    changes.append(
                        PromptSubstitution(component=name, message_index=i, original=old, substituted=sub)
                    )
                    used = used or (active is not None and name in active.spans())
            out.append({**msg, "content": new} if new != text or comp is not None else msg)
        if changes:
            body = {**data, "messages": out}
    elif isinstance(data.get("prompt"), str) and has_marks:
        new, found = _spans(data["prompt"], active)
        for name, old, sub in found:
            changes.append(PromptSubstitution(component=name, original=old, substituted=sub))
            used = used or (active is not None and name in active.spans())
        if found:
            body = {**data, "prompt": new}
    return Substituted(body, active.version if used and active is not None else None, changes)


class PromptStore:
    """The active prompt version and the version pinned to each group (see the module docstring)."""

    def __init__(self, path: Path | None, *, max_pins: int = 100_000) -> None:
        self.path = path
        self.max_pins = max_pins
        self.active: ActivePrompt | None = None
        self._pins: OrderedDict[str, ActivePrompt | None] = OrderedDict()
        if path is not None and path.is_file():
            try:
                self.active = self._load(path)
            except (OSError, ValueError) as exc:  # a damaged file: serve the agent's own prompts, say so
                log.warning("prompt version file unreadable; serving the agent's prompts", error=str(exc))

    @staticmethod
    def _load(path: Path) -> ActivePrompt | None:
        data = json.loads(path.read_text())
        if not data or data.get("version") is None:
            return None
        comps = tuple(PromptComponent.model_validate(c) for c in data["components"])
        return ActivePrompt(str(data["version"]), comps)

    def activate(self, event: PromptVersionRequested) -> ActivePrompt | None:
        """Serve ``event``'s version to groups that have not started yet; persisted before it returns."""
        active = (
            ActivePrompt(event.prompt_version, tuple(event.components))
            if event.prompt_version is not None
            else None
        )
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            blob = (
                {"version": active.version, "components": [c.model_dump() for c in active.components]}
                if active is not None
                else {}
            )
            tmp.write_text(json.dumps(blob))
            tmp.replace(self.path)
        self.active = active
        return active

    def for_episode(self, episode: EpisodeState) -> ActivePrompt | None:
        """The version that serves ``episode``: its group's pin (its own without a group), pinned now to
        the active one if new."""
        if episode.prompt_pinned:
            return episode.prompt_pin
        pin = self.active
        if episode.group_id:
            if episode.group_id in self._pins:
                self._pins.move_to_end(episode.group_id)
                pin = self._pins[episode.group_id]
            else:
                self._pins[episode.group_id] = pin
                while len(self._pins) > self.max_pins:
                    self._pins.popitem(last=False)
        episode.prompt_pinned, episode.prompt_pin = True, pin
        return pin

    def apply(self, episode: EpisodeState, data: dict[str, Any], raw: bytes) -> Substituted:
        return substitute(data, self.for_episode(episode), raw)

    def state(self) -> dict[str, Any]:
        return {
            "prompt_version": self.active.version if self.active is not None else None,
            "prompt_components": [c.name for c in self.active.components] if self.active else [],
        }
