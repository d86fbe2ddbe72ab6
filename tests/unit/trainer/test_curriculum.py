"""``SignalCurriculum``: tasks whose groups carried signal come back, flat ones do not, and tasks the
event log shows flat are skipped."""

from __future__ import annotations

import pytest

from schemas import Task
from trainer.curriculum import SignalCurriculum, has_signal

pytestmark = pytest.mark.timeout(10)


def _tasks(n: int) -> list[Task]:
    return [Task(task_id=f"t{i}") for i in range(n)]


def test_signal_is_a_reward_spread() -> None:
    assert has_signal([1.0, 0.0]) and has_signal([0.2, 0.3, 0.2])
    assert not has_signal([1.0, 1.0]) and not has_signal([0.0]) and not has_signal([])


def test_a_task_with_signal_comes_back_until_max_visits_and_a_flat_one_never() -> None:
    c = SignalCurriculum(iter(_tasks(100)), revisit=1.0, max_visits=3)
    first = c.next_task()
    assert first is not None and first.task_id == "t0"
    c.observe(first, [1.0, 0.0])
    again = []
    for _ in range(2):
        t = c.next_task()
        assert t is not None
        c.observe(t, [0.0, 1.0])
        again.append(t.task_id)
    assert again == ["t0", "t0"]
    nxt = c.next_task()  # three visits: t0 is done, a fresh task follows
    assert nxt is not None and nxt.task_id == "t1"
    c.observe(nxt, [1.0, 1.0])  # all solved: no signal, not revisited
    nxt = c.next_task()
    assert nxt is not None and nxt.task_id == "t2"
    assert c.stats.revisits == 2 and c.stats.fresh == 3
    assert (c.stats.groups_with_signal, c.stats.groups_without_signal) == (3, 1)


def test_revisit_zero_is_the_plain_source_order() -> None:
    c = SignalCurriculum(iter(_tasks(5)), revisit=0.0)
    got = []
    while (t := c.next_task()) is not None:
        c.observe(t, [1.0, 0.0])
        got.append(t.task_id)
        if len(got) > 10:
            break
    # the source runs out, then what waits in the revisit queue is drained (most recent first)
    assert got[:5] == ["t0", "t1", "t2", "t3", "t4"] and got[5] == "t4"


def test_fresh_tasks_the_history_shows_flat_are_skipped_at_most_max_skips_in_a_row() -> None:
    history = {"t0": [[1.0, 1.0], [1.0, 1.0]], "t1": [[0.0, 0.0], [1.0, 0.0]], "t2": [[0.0, 0.0]]}
    c = SignalCurriculum(iter(_tasks(4)), revisit=0.0, window=2, history=history)
    picked = c.next_task()
    assert picked is not None and picked.task_id == "t1"  # t0 flat twice: skipped; t1 had signal
    assert c.stats.skipped == 1
    nxt = c.next_task()  # t2: only one recorded group, fewer than the window: not skipped
    assert nxt is not None and nxt.task_id == "t2"
    capped = SignalCurriculum(
        iter(_tasks(5)), revisit=0.0, max_skips=2, history={f"t{i}": [[0.0, 0.0]] * 2 for i in range(5)}
    )
    nxt = capped.next_task()
    assert nxt is not None and nxt.task_id == "t2" and capped.stats.skipped == 2


def test_a_bad_revisit_probability_is_refused() -> None:
    with pytest.raises(ValueError, match="probability"):
        SignalCurriculum(iter(()), revisit=1.5)
