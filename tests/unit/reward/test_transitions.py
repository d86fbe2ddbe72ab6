"""Transition assembly: exact ids, merging only on the extension property, masks, rewards."""

from __future__ import annotations

from reward_service.transitions import assemble
from tests.unit.reward.calls import call

EP = "e" * 32


def test_calls_that_extend_merge_into_one_masked_trajectory() -> None:
    c0 = call(EP, 0, [1, 2, 3], [10, 11], version=3)
    c1 = call(EP, 1, [1, 2, 3, 10, 11, 50, 51], [12], version=4)  # observation 50, 51
    c2 = call(EP, 2, [1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14], version=4)
    out = assemble([c2, c0, c1], reward=1.0)  # order of arrival does not matter
    [t] = out.transitions
    assert t.prompt_ids == [1, 2, 3]
    assert t.response_ids == [10, 11, 50, 51, 12, 60, 13, 14]
    assert t.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert t.behaviour_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert t.call_seqs == [0, 1, 2] and t.weight_version == 3 and t.reward == 1.0
    assert out.prefix_mismatches == 0 and out.unusable_reason(3) is None


def test_a_rewritten_history_is_never_spliced() -> None:
    c0 = call(EP, 0, [1, 2, 3], [10, 11])
    c1 = call(EP, 1, [1, 2, 9, 10, 11, 50], [12])  # re-tokenised differently
    c2 = call(EP, 2, [1, 2, 9, 10, 11, 50, 12, 70], [13])
    out = assemble([c0, c1, c2], reward=0.5)
    assert out.prefix_mismatches == 1
    assert [t.call_seqs for t in out.transitions] == [[0], [1, 2]]
    assert out.transitions[0].prompt_ids == [1, 2, 3] and out.transitions[0].response_ids == [10, 11]
    assert out.transitions[1].prompt_ids == [1, 2, 9, 10, 11, 50]
    assert all(t.reward == 0.5 for t in out.transitions)


def test_n_choices_yield_one_transition_each_and_the_chosen_one_continues() -> None:
    c0 = call(EP, 0, [1, 2], [10], [20], [30])
    c1 = call(EP, 1, [1, 2, 20, 5], [21])  # continues choice 1
    out = assemble([c0, c1], reward=1.0)
    assert len(out.transitions) == 3 and out.prefix_mismatches == 0
    merged = [t for t in out.transitions if t.call_seqs == [0, 1]]
    assert merged and merged[0].response_ids == [20, 5, 21] and merged[0].response_mask == [1, 0, 1]
    assert sorted(t.response_ids[0] for t in out.transitions) == [10, 20, 30]


def test_discount_and_per_call_rewards() -> None:
    calls = [call(EP, 0, [1], [2]), call(EP, 1, [7], [8]), call(EP, 2, [9], [10])]  # no merges
    out = assemble(calls, reward=1.0, call_rewards={0: 0.25}, discount=0.5)
    assert [t.reward for t in out.transitions] == [0.25 + 0.25, 0.5, 1.0]


def test_unusable_reasons() -> None:
    assert assemble([], reward=1.0).unusable_reason(0) == "no_calls"
    no_ids = assemble([call(EP, 0, None, None)], reward=1.0)
    assert not no_ids.transitions and no_ids.unusable_reason(1) == "no_token_ids"
    errors = assemble(
        [call(EP, 0, [1], [2], error="upstream 500"), call(EP, 1, [1], [2], error="x")], reward=1.0
    )
    assert errors.unusable_reason(2) == "upstream_errors"
    mixed = assemble([call(EP, 0, [1], [2], error="x"), call(EP, 1, [1, 5], [3])], reward=1.0)
    assert len(mixed.transitions) == 1 and mixed.upstream_errors == 1


def test_a_transition_carries_its_calls_temperature_and_another_temperature_is_never_merged() -> None:
    """Behaviour logprobs are of softmax(logits / T): a trajectory holds one T, and the trainer reads it."""
    c0 = call(EP, 0, [1, 2, 3], [10, 11]).model_copy(update={"temperature": 0.7})
    c1 = call(EP, 1, [1, 2, 3, 10, 11, 50], [12]).model_copy(update={"temperature": 0.7})
    c2 = call(EP, 2, [1, 2, 3, 10, 11, 50, 12, 60], [13]).model_copy(update={"temperature": 1.0})
    out = assemble([c0, c1, c2], reward=1.0)
    assert [t.call_seqs for t in out.transitions] == [[0, 1], [2]]  # c2 extends the ids, not the distribution
    assert [t.temperature for t in out.transitions] == [0.7, 1.0]
    assert out.transitions[1].prompt_ids == [1, 2, 3, 10, 11, 50, 12, 60]
    assert out.prefix_mismatches == 0  # the history was kept: not a mismatch


def test_an_unrecorded_or_greedy_temperature_is_one() -> None:
    """Events written before the field, and greedy calls (engines report their logprobs unscaled)."""
    old = call(EP, 0, [1, 2], [10])
    greedy = call(EP, 1, [1, 2, 10, 5], [11]).model_copy(update={"temperature": 0.0})
    [t] = assemble([old, greedy], reward=1.0).transitions
    assert old.temperature is None and t.temperature == 1.0 and t.call_seqs == [0, 1]
