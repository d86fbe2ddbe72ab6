"""A tokenizer's fingerprint tells tokenizers apart, and replay refuses ids another tokenizer made."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

import schemas as s
from flywheel.replay import ReplayFilter, TokenizerMismatchError, check_tokenizer
from infra.tokenizer_fingerprint import fingerprint, fingerprint_of, is_fingerprint


def _tokenizer(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")))


def _saved(tmp_path: Path, name: str, vocab: dict[str, int]) -> Path:
    _tokenizer(vocab).save_pretrained(str(tmp_path / name))
    return tmp_path / name


@pytest.mark.timeout(30)
def test_one_tokenizer_one_fingerprint_and_another_tokenizer_another(tmp_path: Path) -> None:
    vocab = {"<unk>": 0, "a": 1, "b": 2}
    same = fingerprint(_tokenizer(vocab))
    assert is_fingerprint(same) and same == fingerprint(_tokenizer(dict(vocab)))
    assert fingerprint_of(_saved(tmp_path, "saved", vocab)) == same  # saved and loaded back: the same
    assert fingerprint(_tokenizer({"<unk>": 0, "a": 2, "b": 1})) != same  # ids swapped: another
    assert fingerprint(_tokenizer({**vocab, "c": 3})) != same  # one token more: another


def _episode(*tokenizers: str | None) -> s.EpisodeScored:
    return s.EpisodeScored(
        episode_id=s.new_episode_id(),
        group_id="g",
        reward=1.0,
        transitions=[
            s.Transition(
                prompt_ids=[1], response_ids=[2], response_mask=[1], behaviour_logprobs=[-0.1], tokenizer=t
            )
            for t in tokenizers
        ],
    )


@pytest.mark.timeout(10)
def test_replay_refuses_episodes_another_tokenizer_made_in_one_line() -> None:
    ours, theirs = "0123456789abcdef", "fedcba9876543210"
    assert check_tokenizer([_episode(ours), _episode(ours, ours)], ours) == 0
    assert check_tokenizer([_episode(ours), _episode(None)], ours) == 1  # recorded before: counted
    with pytest.raises(TokenizerMismatchError) as caught:
        check_tokenizer([_episode(ours), _episode(theirs), _episode(ours, theirs)], ours)
    message = str(caught.value)
    assert "\n" not in message and f"{theirs} (2 episodes)" in message and f"target's {ours}" in message
    with pytest.raises(ValueError, match="16"):
        ReplayFilter(tokenizer="not-a-fingerprint")
