"""What the bus says about a demo's policies while it trains: calls by the adapter that served them, and
each policy's updates.

:class:`Ledger` reads ``flywheel.episodes`` and ``flywheel.control`` from the moment it starts. Calls are
counted under a key of the call (``by``: the tenant of its key in the two-tenant demo, the role's model
name in the SQL demo) and the adapter that served it (``(base)``: none). Updates are the trainer's
``TrainerStepCompleted``, one per adapter a step trained (``adapter``), or one per step of the whole model
(keyed by its model name) when no policy map is given.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from infra.bus.base import Bus, Message
from schemas import CONTROL, EPISODES, LLMCallRecorded
from schemas.control import TrainerStepCompleted

BASE = "(base)"  # a call no adapter served
# the step figures kept per update
_KEEP = ("step_seconds", "train_seconds", "export_seconds", "adapter_bytes", "reward", "load_ms")


def tenant_of(call: LLMCallRecorded) -> str | None:
    return call.tenant


def model_of(call: LLMCallRecorded) -> str | None:
    return call.model


class Ledger:
    """Calls per ``by(call)`` and adapter (with the adapter versions they were recorded with), and each
    policy's trainer updates, from :meth:`start` to :meth:`stop`."""

    def __init__(self, bus: Bus, by: Callable[[LLMCallRecorded], str | None] = tenant_of) -> None:
        self.bus = bus
        self.by = by
        self.calls: dict[str, Counter[str]] = {}
        self.versions: dict[str, set[int]] = {}
        self.steps: dict[str, list[dict[str, float]]] = {}
        self._subs: list[Any] = []

    async def start(self) -> None:
        group = f"demo-ledger-{time.monotonic_ns()}"
        self._subs = [
            await self.bus.subscribe(EPISODES, group, self._on_event, from_beginning=False),
            await self.bus.subscribe(CONTROL, group, self._on_event, from_beginning=False),
        ]

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()

    async def _on_event(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, LLMCallRecorded):
            key = self.by(event)
            if not key:
                return
            adapter = event.adapter or BASE
            self.calls.setdefault(key, Counter())[adapter] += 1
            if event.adapter_version is not None:
                self.versions.setdefault(adapter, set()).add(event.adapter_version)
        elif isinstance(event, TrainerStepCompleted):
            m = event.metrics.as_dict()
            self.steps.setdefault(event.adapter or event.model, []).append(
                {"version": float(event.version), **{k: m[k] for k in _KEEP if k in m}}
            )

    def adapters(self) -> dict[str, dict[str, Any]]:
        """Per policy (an adapter, or the whole model): its updates, the last version trained, the bytes of
        the adapter's export (None: the whole model), seconds per update (mean, min, max)."""
        out: dict[str, dict[str, Any]] = {}
        for name, steps in sorted(self.steps.items()):
            seconds = [s["step_seconds"] for s in steps if "step_seconds" in s]
            size = steps[-1].get("adapter_bytes")
            out[name] = {
                "updates": len(steps),
                "versions": int(max(s["version"] for s in steps)),
                "adapter_bytes": None if size is None else int(size),
                "seconds_per_update": summary(seconds),
                "train_seconds_per_update": summary(
                    [s["train_seconds"] for s in steps if "train_seconds" in s]
                ),
                # the adapter versions its calls were recorded with: how many, the first and the last
                "versions_served": _span(self.versions.get(name, set())),
            }
        return out


def _span(versions: set[int]) -> dict[str, int] | None:
    if not versions:
        return None
    return {"distinct": len(versions), "first": min(versions), "last": max(versions)}


def summary(values: list[float], digits: int = 4) -> dict[str, float] | None:
    """Mean, min and max of ``values`` rounded to ``digits`` (None when there are none)."""
    if not values:
        return None
    return {
        "mean": round(sum(values) / len(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }
