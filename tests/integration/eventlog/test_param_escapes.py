"""Filter values with a backslash, quote, tab or newline bind literally on chdb: they match themselves.

chdb reads a bound scalar in ClickHouse's Escaped text format, where ``\\`` starts an escape sequence:
unescaped, a lone backslash made the engine refuse the query (the web view answered 503) and ``a\\b``
matched ``a<backspace>``. Each awkward value here is a recorded tenant and task id, found by the exact
filters, the LIKE filter and the id list, and a value nobody recorded matches nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flywheel.ui.params import parse_list_query
from infra.eventlog.models import CallFilter, EpisodeFilter
from infra.eventlog.store import ChdbStore, _chdb_param
from tests.integration.eventlog.helpers import T0, episode

pytestmark = pytest.mark.timeout(60)

AWKWARD = ["back\\slash", "\\", "ends\\", "\\N", "it's", "a\\'b", "tab\there", "new\nline", "a\\tb", "a\\nb"]


def _ep(index: int) -> str:
    return f"{index:032x}"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    st = ChdbStore(tmp_path_factory.mktemp("escapes") / "chdb", database="evescape")
    try:
        st.migrate()
        for i, value in enumerate(AWKWARD, start=1):
            st.insert(
                episode(index=i, group_id=f"g{i}", task_id=f"task-{value}", tenant=value, at=T0, calls=1,
                        version=1, reward=1.0)
            )  # fmt: skip
        yield st
    finally:
        st.close()


def test_scalars_and_array_items_are_escaped_for_the_text_format() -> None:
    assert _chdb_param("a\\b") == "a\\\\b"
    assert _chdb_param("it's") == "it\\'s"
    assert _chdb_param("t\tn\n") == "t\\tn\\n"
    assert _chdb_param(["a\\b", "t\tb"]) == "['a\\\\b','t\\tb']"
    assert _chdb_param(7) == "7"


@pytest.mark.parametrize("index", range(1, len(AWKWARD) + 1))
def test_each_awkward_value_matches_exactly_itself(store: ChdbStore, index: int) -> None:
    value = AWKWARD[index - 1]
    found = store.episodes(EpisodeFilter(tenant=value))
    assert [e.episode_id for e in found] == [_ep(index)], value
    assert found[0].tenant == value
    assert [e.episode_id for e in store.episodes(EpisodeFilter(task_id=f"task-{value}"))] == [_ep(index)]
    assert [e.episode_id for e in store.episodes(EpisodeFilter(episode_ids=[_ep(index)], tenant=value))] == [
        _ep(index)
    ]
    assert [c.episode_id for c in store.select_calls(CallFilter(tenant=value))] == [_ep(index)]


@pytest.mark.parametrize("index", range(1, len(AWKWARD) + 1))
def test_the_web_views_task_search_finds_the_awkward_text(store: ChdbStore, index: int) -> None:
    value = AWKWARD[index - 1]
    # The list's "task" box escapes LIKE's own wildcards; the binding must keep those escapes intact.
    f = parse_list_query({"task": f"k-{value.strip()}"}).filter
    assert _ep(index) in [e.episode_id for e in store.episodes(f)], value


@pytest.mark.parametrize("value", ["\\\\", "\\x", "no\\such", "'", "\t", "\\t", "\\n", "\n"])
def test_a_value_nobody_recorded_matches_nothing(store: ChdbStore, value: str) -> None:
    assert store.episodes(EpisodeFilter(tenant=value)) == []
    assert list(store.select_calls(CallFilter(tenant=value))) == []
