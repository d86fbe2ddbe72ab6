"""The garbage-collector policy of a process that runs the in-process bus.

Why: the bus's log keeps up to ``retain`` events per partition (a benchmark's bus 10⁵ and more) after
every group has handled them, so that a group joining later can read them. A validated ``LLMCallRecorded`` is ~11
GC-tracked containers (the model, its ``__dict__`` and field set, the token-id and logprob lists, the
choice model …) holding ~200 references, and they all survive. CPython's generational collector
walks each of them in every young collection it survives and again in every full collection, and
full collections come each time the survivors grow by a quarter of the old generation: on the bus
benchmark the collections took longer than the work (docs/results/tuning.md).

What: every ``tenure_every`` appends, the bus moves every object that is alive at that moment into the
permanent generation (``gc.freeze()``, O(1)), so collections stop walking them: an object is scanned
about once, in the young collection it survives first. Reference counting still frees frozen objects
(a trimmed event is freed at once). The freeze may also catch cyclic garbage that no collection has
reached yet; it waits for the next release. A release (``gc.unfreeze()`` then one full collection)
happens at the first tenure after both ``release_every_s`` seconds and ``release_every_appends``
appends since the last one, and when the last running bus stops. So cyclic garbage is held for at
most that long, and what it can amount to is bounded by what the process allocates meanwhile; a full
collection runs at most once per ``release_every_s`` while the bus is busy (instead of several per
second) and not more often than every ``release_every_appends`` appends when it is not (default
thresholds would run one every ~45k appends once the log is full). ``stats`` keeps the pause of the
last release (the benchmark reports it).

The policy is process-wide, as the collector is: buses share it and count their appends together. A
process that disabled the collector (``gc.disable()``) keeps its choice: the policy then does nothing.
A release also hands back objects frozen by others (the gateway freezes its startup heap): the next
tenure freezes them again.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

TENURE_EVERY = 256  # appends (~2,800 tracked objects of call events: ~4 young collections)
RELEASE_EVERY_S = 30.0
# Frozen cyclic garbage waits for a release: ~1 KB a call in the embedded stack (tracemalloc, the soak
# benchmark), so 10,000 appends (~4,000 calls) hold a few MB of it at most; 50,000 held ~20 MB and
# made the process's memory a slow sawtooth.
RELEASE_EVERY_APPENDS = 10_000


@dataclass
class GcStats:
    tenures: int = 0
    releases: int = 0
    last_release_pause_s: float = 0.0


@dataclass
class GcPolicy:
    tenure_every: int = TENURE_EVERY
    release_every_s: float = RELEASE_EVERY_S
    release_every_appends: int = RELEASE_EVERY_APPENDS
    enabled: bool = True
    stats: GcStats = field(default_factory=GcStats)
    _users: int = 0
    _count: int = 0
    _frozen_since: float | None = None  # monotonic time of the first tenure since the last release
    _frozen_appends: int = 0  # appends since then

    def acquire(self) -> None:
        """A bus started."""
        self._users += 1

    def release(self) -> None:
        """A bus stopped; the last one hands the frozen objects back."""
        self._users = max(0, self._users - 1)
        if not self._users:
            self._release()

    def appended(self) -> None:
        """One record appended to a bus's log (called on every append: keep it cheap)."""
        self._count += 1
        if self._count >= self.tenure_every:
            self._tick()

    def _tick(self) -> None:
        appends, self._count = self._count, 0
        if not self.enabled or not gc.isenabled():
            return
        now = time.monotonic()
        if self._frozen_since is None:
            self._frozen_since, self._frozen_appends = now, 0
        else:
            self._frozen_appends += appends
            if (
                now - self._frozen_since >= self.release_every_s
                and self._frozen_appends >= self.release_every_appends
            ):
                self._release()
                return
        gc.freeze()
        self.stats.tenures += 1

    def _release(self) -> None:
        if self._frozen_since is None:
            return
        self._frozen_since = None
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        self.stats.releases += 1
        self.stats.last_release_pause_s = time.perf_counter() - started


POLICY = GcPolicy()
