"""The in-process bus's GC policy: tenure on appends, bounded by releases (``infra.bus.gc_policy``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from infra.bus.gc_policy import GcPolicy
from infra.bus.memory import MemoryBus
from tests.integration.bus.helpers import call_event

pytestmark = pytest.mark.timeout(20)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_tenure_freezes_every_n_appends_and_release_hands_back() -> None:
    policy = GcPolicy(tenure_every=10)
    policy.acquire()
    for _ in range(9):
        policy.appended()
    assert gc.get_freeze_count() == 0 and policy.stats.tenures == 0
    policy.appended()
    assert gc.get_freeze_count() > 0 and policy.stats.tenures == 1
    policy.release()  # the last user: everything goes back, one full collection
    assert gc.get_freeze_count() == 0 and policy.stats.releases == 1


def test_a_frozen_garbage_cycle_is_freed_at_the_release() -> None:
    policy = GcPolicy(tenure_every=1, release_every_s=3600)
    policy.acquire()
    node = _Node()
    ref = weakref.ref(node)
    policy.appended()  # tenured while still alive
    del node
    gc.collect()
    assert ref() is not None, "a frozen cycle waits for the release"
    policy.release()
    assert ref() is None


def test_release_after_release_every_s_and_appends() -> None:
    policy = GcPolicy(tenure_every=1, release_every_s=0.0, release_every_appends=3)
    policy.acquire()
    for _ in range(3):
        policy.appended()  # tenures; the time has passed but not the appends
    assert policy.stats.tenures == 3 and policy.stats.releases == 0
    policy.appended()  # both have passed: release instead of a fourth freeze
    assert policy.stats.tenures == 3 and policy.stats.releases == 1
    assert gc.get_freeze_count() == 0
    slow = GcPolicy(tenure_every=1, release_every_s=3600.0, release_every_appends=1)
    slow.acquire()
    for _ in range(5):
        slow.appended()  # enough appends, not enough time
    assert slow.stats.releases == 0


def test_a_disabled_collector_is_left_alone() -> None:
    policy = GcPolicy(tenure_every=1)
    policy.acquire()
    gc.disable()
    try:
        policy.appended()
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0 and policy.stats.tenures == 0


async def test_the_bus_tenures_its_log_and_releases_on_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = GcPolicy(tenure_every=4)
    monkeypatch.setattr("infra.bus.gc_policy.POLICY", policy)
    bus = MemoryBus()
    await bus.start()
    for seq in range(8):
        await bus.publish("flywheel.episodes", call_event("ep", seq, size=200))
    assert policy.stats.tenures == 2 and gc.get_freeze_count() > 0
    await bus.stop()
    assert policy.stats.releases == 1 and gc.get_freeze_count() == 0
