"""vLLM 0.33 reports ``weight_versions`` as spans of output tokens (``vllm/outputs.py``
``WeightVersionSpan``; see tests/fixtures/vllm_v0_33_transcript.json): the gateway records one integer
version per token, as it does for the embedded engine's per-token list."""

from __future__ import annotations

from gateway.recording.capture import _ChoiceAcc


def test_spans_become_one_version_per_token() -> None:
    acc = _ChoiceAcc(index=0)
    acc.add_versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}])
    assert acc.weight_versions == [3, 3, 4, 4, 4]


def test_the_embedded_engines_per_token_list_still_works() -> None:
    acc = _ChoiceAcc(index=0)
    acc.add_versions([1, 1, 2])
    assert acc.weight_versions == [1, 1, 2]


def test_labels_that_are_not_integer_versions_or_gaps_are_not_guessed() -> None:
    for bad in (
        [{"version": "policy-v3", "start": 0, "end": 2}],
        [{"version": "3", "start": 1, "end": 2}],  # a gap: tokens 0..1 unlabelled
        [{"version": "3", "start": 0}],
        ["3"],
    ):
        acc = _ChoiceAcc(index=0)
        acc.add_versions(bad)
        assert acc.weight_versions is None, bad
