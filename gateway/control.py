"""Pause/resume around weight updates (docs/architecture.md, "The weight-update protocol") and the served weight version.

``Admission`` gates every call: while paused a new call waits (up to ``hold_s``, then
:class:`PausedError` → 503 + Retry-After); calls already admitted finish. ``pause()`` returns once no
call is in flight (or ``drain_timeout_s`` passed: reported, not waited on forever), with what it waited
for: the calls in flight when it began and those still in flight when it returned. ``resume()`` stamps
the version that serves from then on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gateway.errors import PausedError


@dataclass(frozen=True, slots=True)
class DrainResult:
    version: int
    waited_ms: float
    timed_out: bool
    in_flight: int  # calls in flight when the pause began: what it waited for
    still_in_flight: int  # those not finished when it returned (past its deadline)


class Admission:
    def __init__(self, *, weight_version: int = 0, hold_s: float = 30.0) -> None:
        self.weight_version = weight_version
        self.hold_s = hold_s
        self.in_flight = 0
        self.paused = False
        self.pending_version: int | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self) -> int:
        """Admit one call; returns the weight version that serves it."""
        if self.paused:
            try:
                await asyncio.wait_for(self._resumed.wait(), self.hold_s)
            except TimeoutError:
                raise PausedError(
                    "inference is paused for a weight update; retry shortly",
                    code="paused",
                    retry_after_s=max(1.0, self.hold_s / 2),
                ) from None
        self.in_flight += 1
        self._idle.clear()
        return self.weight_version

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def pause(self, version: int | None, drain_timeout_s: float) -> DrainResult:
        """Stop admitting and wait for in-flight calls to finish (at most ``drain_timeout_s``)."""
        self.paused = True
        self.pending_version = version
        self._resumed.clear()
        start = time.perf_counter()
        in_flight = self.in_flight
        timed_out = False
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        except TimeoutError:
            timed_out = True
        return DrainResult(
            version if version is not None else self.weight_version,
            (time.perf_counter() - start) * 1000,
            timed_out,
            in_flight,
            self.in_flight,
        )

    def resume(self, version: int | None = None) -> int:
        """Admit again; ``version`` (when given) serves new calls from now on."""
        if version is not None:
            self.weight_version = version
        self.paused = False
        self.pending_version = None
        self._resumed.set()
        return self.weight_version
