"""Builders shared by the trainer's tests: a tiny random Qwen2 and scored episodes."""

from __future__ import annotations

from schemas import EpisodeScored, EpisodeStatus, Transition

VOCAB = 64


def tiny_model(seed: int = 0, vocab: int = VOCAB):  # type: ignore[no-untyped-def]
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).float()  # type: ignore[no-untyped-call]


def transition(
    prompt: list[int] | None = None,
    response: list[int] | None = None,
    *,
    mask: list[int] | None = None,
    logprob: float = -1.0,
    version: int = 0,
    reward: float = 0.0,
) -> Transition:
    prompt = prompt if prompt is not None else [1, 2, 3]
    response = response if response is not None else [4, 5]
    mask = mask if mask is not None else [1] * len(response)
    return Transition(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        behaviour_logprobs=[logprob if m else 0.0 for m in mask],
        weight_version=version,
        reward=reward,
    )


def episode(
    group_id: str,
    index: int,
    reward: float | None,
    *,
    group_size: int = 2,
    transitions: list[Transition] | None = None,
    task_id: str = "task",
    attempt: int = 0,
    status: EpisodeStatus = EpisodeStatus.ok,
    **kw: object,
) -> EpisodeScored:
    return EpisodeScored(
        episode_id=f"{group_id}-e{index}-a{attempt}",
        group_id=group_id,
        group_size=group_size,
        task_id=task_id,
        attempt=attempt,
        sample_index=index,
        reward=reward,
        status=status,
        transitions=transitions if transitions is not None else [transition(reward=reward or 0.0)],
        num_calls=len(transitions) if transitions is not None else 1,
        **kw,
    )
