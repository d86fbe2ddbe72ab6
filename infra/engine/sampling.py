"""Sampling parameters and the batched sampler.

Logprobs are those of the distribution actually sampled from (vLLM's ``processed_logprobs``): the
logits are divided by the temperature, masked by top-k and then top-p, and log-softmaxed; the sampled
token's logprob and the top alternatives are read from that. The trainer's importance ratio
``pi_new(a) / pi_behaviour(a)`` is then exact for what was sampled. Greedy requests (temperature 0)
report the raw ``log_softmax`` of the logits, as there is no sampling distribution to speak of.

Each sequence draws from its own ``torch.Generator`` (seeded from the request's ``seed``, choice ``i``
of ``n`` using ``seed + i``), one uniform number per token, and picks the token by inverse CDF. So a
seeded request samples the same tokens whether it runs alone or batched with others (up to float
rounding of batched matmuls, which in practice never flips a token; see the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


class InvalidRequestError(ValueError):
    """A request the engine cannot serve as asked (bad parameter, prompt too long)."""


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks for; field names follow vLLM's ``SamplingParams``."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    max_tokens: int | None = None  # None: up to the model's context length
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token's plus top-k alternatives
    skip_special_tokens: bool = True
    min_tokens: int = 0  # kept for validation symmetry with vLLM; only 0 is supported

    def validate(self, vocab_size: int) -> None:
        if self.n < 1 or self.n > 128:
            raise InvalidRequestError(f"n must be between 1 and 128, got {self.n}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (disable) or positive, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError(f"logprobs/top_logprobs must be between 0 and 20, got {self.logprobs}")
        if self.min_tokens:
            raise InvalidRequestError("min_tokens is not supported by the embedded engine")
        for tid in self.stop_token_ids:
            if not 0 <= tid < vocab_size:
                raise InvalidRequestError(f"stop_token_ids contains {tid}, outside the vocabulary")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]  # per row, empty when the row asked for none


def processed_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """``log_softmax`` of ``logits / T`` after top-k then top-p masking; rows with T == 0 stay raw.

    ``logits`` ``[B, V]`` fp32; ``temperature``/``top_p`` ``[B]`` float; ``top_k`` ``[B]`` long, 0 = off.
    The same function serves the engine and the teacher-forced check in the tests.
    """
    greedy = temperature < GREEDY_EPS
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    vocab = logits.shape[1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    needs_mask = (~greedy) & ((k < vocab) | (top_p < 1.0))
    if bool(needs_mask.any()):
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab).unsqueeze(0)
        drop = ranks >= k.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # keep a token if the mass strictly before it is below top_p (the top token always stays)
        before = probs.cumsum(dim=-1) - probs
        drop = drop | (before >= top_p.unsqueeze(1))
        drop[:, 0] = False
        drop = drop & needs_mask.unsqueeze(1)
        masked = torch.zeros_like(drop).scatter(1, order, drop)
        scaled = scaled.masked_fill(masked, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
    forced: Sequence[int | None] | None = None,
) -> SampleResult:
    """Pick one token per row of ``logits`` ``[B, V]`` with each row's parameters and generator.

    ``forced`` (tests only, forcing.py): a row with a token id takes that token instead, with its logprob
    read from the same processed distribution; its generator still draws, so nothing else shifts.
    """
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    top_k = torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    logprobs = processed_logprobs(logits, temperature, top_k, top_p)
    greedy = temperature < GREEDY_EPS
    uniforms = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    cdf = logprobs.double().exp().cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    sampled = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=logits.shape[1] - 1)
    chosen = torch.where(greedy, logits.argmax(dim=-1), sampled)
    if forced is not None:
        override = torch.tensor([-1 if f is None else f for f in forced], dtype=torch.long)
        chosen = torch.where(override >= 0, override, chosen)
    chosen_lp = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
    top: list[list[tuple[int, float]]] = [[] for _ in params]
    want = max((p.logprobs or 0) for p in params)
    if want > 0:
        values, indices = logprobs.topk(min(want, logprobs.shape[1]), dim=-1)
        vals, idxs = values.tolist(), indices.tolist()
        for row, p in enumerate(params):
            k = p.logprobs or 0
            top[row] = list(zip(idxs[row][:k], vals[row][:k], strict=True))
    return SampleResult(chosen.tolist(), chosen_lp.tolist(), top)
