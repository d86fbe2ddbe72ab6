"""The policy map (infra/policies.py), how the reward service keeps policies apart in transitions, and how
the trainer splits a GRPO group by policy (trainer/policy_service.py)."""

from __future__ import annotations

import pytest

from infra.policies import PolicyMap, PolicyMapError
from reward_service.transitions import assemble
from schemas import LLMCallRecorded
from tests.unit.reward.calls import call
from tests.unit.trainer.helpers import episode, transition
from trainer.groups import Group
from trainer.policy_service import split_by_policy

pytestmark = pytest.mark.timeout(30)


def _body(system: str | None) -> dict[str, object]:
    msgs: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
    if system is not None:
        msgs.insert(0, {"role": "system", "content": system})
    return {"messages": msgs}


def test_names_select_their_model_names() -> None:
    m = PolicyMap.parse("writer, rewriter")
    assert m.names == ["writer", "rewriter"]
    assert m.policy_for("writer", None, _body(None)) == "writer"
    assert m.policy_for("rewriter", "acme", _body(None)) == "rewriter"
    assert m.policy_for("checker", None, _body(None)) is None  # the base: trains nothing
    assert not PolicyMap.parse("") and PolicyMap.parse("").policy_for("writer", None, {}) is None


def test_tenant_system_prompt_and_catch_all_in_order() -> None:
    m = PolicyMap.parse(
        '{"acme": {"tenants": ["acme"]}, "critic": {"system_match": "^You are a critic"},'
        ' "solo": {"models": ["solo"], "tenants": ["zeta"]}, "shared": {}}'
    )
    assert m.policy_for("policy", "acme", _body("You are a critic.")) == "acme"  # first match wins
    assert m.policy_for("policy", "other", _body("You are a critic.")) == "critic"
    assert (
        m.policy_for("policy", "other", '{"messages": [{"role": "system", "content": "You are a critic"}]}')
        == "critic"
    )
    assert m.policy_for("solo", "zeta", _body(None)) == "solo"  # every selector given must match
    assert m.policy_for("solo", "acme2", _body(None)) == "shared"  # no selector: every call
    assert m.policy_for("policy", None, _body(None)) == "shared"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"a": 3}', "selectors are an object"),
        ('{"a": {"model": ["x"]}}', "unknown selector"),
        ('{"a": {"system_match": "("}}', "not a regular expression"),
        ('{"a": {"tenants": 3}}', "list of names"),
        ("bad name!", "policy name"),
        ("a,a", "named twice"),
    ],
)
def test_a_bad_map_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PolicyMapError, match=message):
        PolicyMap.parse(text)


def _served(c: LLMCallRecorded, adapter: str | None, version: int | None) -> LLMCallRecorded:
    return c.model_copy(update={"adapter": adapter, "adapter_version": version})


def test_transitions_carry_the_policy_and_never_merge_two() -> None:
    first = _served(call("e", 0, [1, 2], [3, 4], version=5), "writer", 2)
    # the next call extends the first exactly, but another adapter served it: a transition of its own
    second = _served(call("e", 1, [1, 2, 3, 4, 9], [7], version=5), "rewriter", 0)
    third = _served(call("e", 2, [1, 2, 3, 4, 9, 7, 8], [6], version=5), "rewriter", 0)
    out = assemble([first, second, third], reward=1.0)
    assert [(t.policy, t.call_seqs, t.weight_version) for t in out.transitions] == [
        ("writer", [0], 2),  # the adapter's version, not the base's
        ("rewriter", [1, 2], 0),
    ]
    assert out.prefix_mismatches == 0
    base = assemble([call("e", 0, [1, 2], [3, 4], version=5)], reward=1.0)
    assert base.transitions[0].policy is None and base.transitions[0].weight_version == 5


def test_a_group_is_split_by_policy_and_never_mixes_them() -> None:
    g = Group("g", 3, 0.0)
    both = episode("g", 0, 1.0, group_size=3, transitions=[transition(), transition()])
    both = both.model_copy(
        update={
            "transitions": [
                both.transitions[0].model_copy(update={"policy": "writer"}),
                both.transitions[1].model_copy(update={"policy": "rewriter"}),
            ]
        }
    )
    only_writer = episode(
        "g", 1, 0.0, group_size=3, transitions=[transition().model_copy(update={"policy": "writer"})]
    )
    failed = episode("g", 2, 0.0, group_size=3, transitions=[])
    unknown = episode(
        "g", 3, 0.0, group_size=3, transitions=[transition(), transition().model_copy(update={"policy": "x"})]
    )
    for e in (both, only_writer, failed, unknown):
        g.members[e.episode_id] = e
    split, unmatched = split_by_policy([g], ["writer", "rewriter"])
    assert unmatched == 2  # the base's transition and an unknown policy's
    (writer,) = split["writer"]
    (rewriter,) = split["rewriter"]
    assert set(writer.members) == {both.episode_id, only_writer.episode_id, failed.episode_id}
    assert set(rewriter.members) == {both.episode_id, failed.episode_id}  # not the writer-only member
    for sub, policy in ((writer, "writer"), (rewriter, "rewriter")):
        assert all(t.policy == policy for e in sub.episodes() for t in e.transitions)
        assert sub.group_id == "g"
