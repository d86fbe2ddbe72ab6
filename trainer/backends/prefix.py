"""Shared-prompt microbatches: a prompt that several samples start with runs through the model once.

The G episodes of a GRPO group answer the same task, so their first calls share the whole prompt
(the demo: a 48-token system + user prompt, then 16 generated tokens). Training them as G full rows
runs the prompt G times, forward and backward (measured: three quarters of a demo step on prompt
tokens; docs/results/tuning.md). Here the prompt's first ``P - 1`` tokens run once per distinct
prompt, with the model's KV cache on; the cache rows are then selected per sample (``index_select``
along the batch, so every sample's gradient flows back into the one prompt pass), and each sample runs only
``[last prompt token] + response[:-1]``: position ``j`` predicts ``response[j]``, as in ``_Rows``.

The result is the same loss and gradient up to float summation order (tested against full rows).
Prompts of one microbatch are right-padded (the padding is masked out of every attention); each
sample's positions continue from its own prompt's length.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from trainer.batching import Sample
from trainer.loss import gather_logprobs


class SharedRows:
    """One microbatch of prompt clusters: ``prefix_*`` per distinct prompt, the rest per sample."""

    def __init__(self, clusters: Sequence[Sequence[Sample]], pad_id: int, device: torch.device) -> None:
        prefix_len = max(len(c[0].prompt_ids) for c in clusters) - 1
        rows = [s for c in clusters for s in c]
        width = max(len(s.response_ids) for s in rows)
        heads = [c[0].prompt_ids[:-1] for c in clusters]
        # padded Python lists, one tensor per field: a tensor per row and field cost ~4 ms a demo step
        prefix_attn = torch.tensor(
            [[1] * len(h) + [0] * (prefix_len - len(h)) for h in heads], dtype=torch.long
        )
        select = torch.tensor([ci for ci, c in enumerate(clusters) for _ in c], dtype=torch.long)
        ids, targets, attn, positions, weights, adv, behaviour = [], [], [], [], [], [], []
        for s in rows:
            pad = width - len(s.response_ids)
            ids.append(s.prompt_ids[-1:] + s.response_ids[:-1] + [pad_id] * pad)
            targets.append(s.response_ids + [pad_id] * pad)
            attn.append([1] * len(s.response_ids) + [0] * pad)
            start = len(s.prompt_ids) - 1
            positions.append(list(range(start, start + width)))
            w, a, b = s.token_rows(pad)
            weights.append(w)
            adv.append(a)
            behaviour.append(b)
        self.prefix_ids = torch.tensor(
            [h + [pad_id] * (prefix_len - len(h)) for h in heads], dtype=torch.long
        ).to(device)
        self.prefix_attn = prefix_attn.to(device)
        self.index = select.to(device)
        self.ids = torch.tensor(ids, dtype=torch.long).to(device)
        self.attn = torch.cat([prefix_attn[select], torch.tensor(attn, dtype=torch.long)], dim=1).to(device)
        self.positions = torch.tensor(positions, dtype=torch.long).to(device)
        self.targets = torch.tensor(targets, dtype=torch.long).to(device)
        self.weights = torch.tensor(weights, dtype=torch.float32).to(device)
        self.adv = torch.tensor(adv, dtype=torch.float32).to(device)
        self.behaviour = torch.tensor(behaviour, dtype=torch.float32).to(device)
        self.temperature = torch.tensor([s.temperature for s in rows], dtype=torch.float32).to(device)
        self.padded_tokens = len(clusters) * prefix_len + len(rows) * width
        self.real_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in rows)


def supports_shared_prompts(model: torch.nn.Module) -> bool:
    """A Hugging Face causal LM whose decoder returns a cache we can select rows of."""
    get_decoder = getattr(model, "get_decoder", None)
    if get_decoder is None:
        return False
    try:
        decoder = get_decoder()
    except (AttributeError, NotImplementedError):
        return False
    params = inspect.signature(model.forward).parameters
    return decoder is not model and ("cache" in params or "past_key_values" in params)


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward computes logits for the last N positions only (``logits_to_keep``:
    Hugging Face causal LMs since transformers 4.45; a peft model passes it to its base)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _cache_kwarg(model: torch.nn.Module) -> str:
    # transformers ≥ 5.2x calls it ``cache`` (``past_key_values`` is deprecated); older ones do not know it
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def shared_logprobs(model: Any, rows: SharedRows) -> torch.Tensor:
    """Log-probabilities ``[rows, response_len]`` of every sample's response tokens."""
    out = model.get_decoder()(input_ids=rows.prefix_ids, attention_mask=rows.prefix_attn, use_cache=True)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = out.past_key_values
    cache.batch_select_indices(rows.index)
    logits = model(
        input_ids=rows.ids,
        attention_mask=rows.attn,
        position_ids=rows.positions,
        use_cache=True,
        **{_cache_kwarg(model): cache},
    ).logits
    return gather_logprobs(logits, rows.targets, rows.temperature)


def split_by_prompt(samples: Sequence[Sample]) -> tuple[list[list[Sample]], list[Sample]]:
    """(clusters of ≥ 2 samples with the same prompt of ≥ 2 tokens, the other samples), in order."""
    by_prompt: dict[tuple[int, ...], list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    clusters = [c for key, c in by_prompt.items() if len(c) >= 2 and len(key) >= 2]
    shared = {id(s) for c in clusters for s in c}
    return clusters, [s for s in samples if id(s) not in shared]


def pack_clusters(
    clusters: Sequence[Sequence[Sample]], token_budget: int, pad_id: int, device: torch.device
) -> list[SharedRows]:
    """Clusters packed into microbatches of at most ``token_budget`` padded tokens (one cluster at least)."""
    ordered = sorted(clusters, key=lambda c: len(c[0].prompt_ids))
    out: list[SharedRows] = []
    current: list[Sequence[Sample]] = []
    prefix = width = rows = 0
    for cluster in ordered:
        p = len(cluster[0].prompt_ids) - 1
        w = max(len(s.response_ids) for s in cluster)
        cost = (len(current) + 1) * max(prefix, p) + (rows + len(cluster)) * max(width, w)
        if current and cost > token_budget:
            out.append(SharedRows(current, pad_id, device))
            current, prefix, width, rows = [], 0, 0, 0
        current.append(cluster)
        prefix, width, rows = max(prefix, p), max(width, w), rows + len(cluster)
    if current:
        out.append(SharedRows(current, pad_id, device))
    return out
