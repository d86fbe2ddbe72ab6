"""One engine step on the worker thread: compact the batch, decode, admit (prefill), sample, stop.

``BatchStepper`` holds the per-step logic of ``InferenceEngine`` (core.py), which owns the scheduling
around it. Everything here runs on the engine's single worker thread while the scheduler awaits it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from infra.engine.outputs import ChoiceResult, FinishReason, RequestUpdate, TokenEvent
from infra.engine.runner import KVRunner
from infra.engine.sampling import SamplingParams, sample


@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    queue: asyncio.Queue[RequestUpdate | BaseException | None]
    forced: list[int] | None = None  # forcing.py: tokens to emit instead of sampling (tests only)
    adapter: str | None = None  # the LoRA adapter that serves it (adapters.py); None: the base
    # sequences not done; no list of them: each Seq points back here, and a cycle waits for the GC
    unfinished: int = 0
    cancelled: bool = False


@dataclass(eq=False)
class Seq:
    req: Request
    index: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False

    def forced_next(self) -> int | None:
        forced = self.req.forced
        return forced[len(self.tokens)] if forced is not None and len(self.tokens) < len(forced) else None

    @property
    def cached(self) -> int:
        """Positions in the KV cache: the prompt and every token but the newest (not yet fed)."""
        return len(self.req.prompt) + len(self.tokens) - 1


class BatchStepper:
    """The step itself; ``InferenceEngine`` sets these attributes up."""

    runner: KVRunner
    tokenizer: Any
    eos_token_ids: frozenset[int]
    max_model_len: int
    generated_tokens: int
    steps: int
    _version: int
    _running: list[Seq]
    _seed_source: torch.Generator

    def _step(self, admits: list[Request], running: list[Seq], decode: bool) -> dict[Request, RequestUpdate]:
        runner = self.runner
        updates: dict[Request, RequestUpdate] = {}
        # 1. compact: live sequences move down into the slots of finished ones (ascending, so safe)
        live: list[Seq] = []
        for slot, seq in enumerate(running):
            if seq.done:
                continue
            if slot != len(live):
                runner.move_slot(slot, len(live), seq.cached)
            live.append(seq)
        # 2. decode one token for every live sequence (before admitting, so rows are 0..B-1)
        if decode and live:
            runner.reserve(len(live), max(s.cached for s in live) + 1)  # grows by doubling, rarely
            tokens, positions = [s.tokens[-1] for s in live], [s.cached for s in live]
            names = [s.req.adapter for s in live]
            # base-only traffic (no adapter in the batch) takes the plain path
            logits = (
                runner.decode(tokens, positions, names) if any(names) else runner.decode(tokens, positions)
            )
            self._take(live, logits, updates)
        # 3. admit: one batched prefill of the distinct prompts (a GRPO group sends the same prompt
        #    G times: it is computed once), cache rows copied to every other sequence of that prompt,
        #    then each sequence samples its first token.
        if admits:
            first = len(live)
            total = first + sum(r.params.n for r in admits)
            runner.reserve(total, max(len(r.prompt) for r in admits) + 1)
            # a prompt is shared only under the same adapter: another adapter's cache rows differ
            owners: dict[tuple[str | None, tuple[int, ...]], int] = {}
            slots: list[int] = []
            slot = first
            for req in admits:
                slots.append(slot)
                owners.setdefault((req.adapter, tuple(req.prompt)), slot)
                slot += req.params.n
            distinct = list(owners)
            logits = runner.prefill_many(
                [list(p) for _, p in distinct], [owners[p] for p in distinct], [a for a, _ in distinct]
            )
            row_of = {p: i for i, p in enumerate(distinct)}
            for req, start in zip(admits, slots, strict=True):
                owner = owners[(req.adapter, tuple(req.prompt))]
                copies = [s for s in range(start, start + req.params.n) if s != owner]
                if copies:
                    runner.copy_slot(owner, copies, len(req.prompt))
            new_seqs: list[Seq] = []
            rows: list[int] = []
            for req in admits:
                seeds = (
                    [(req.params.seed + i) % 2**63 for i in range(req.params.n)]
                    if req.params.seed is not None
                    else [
                        int(torch.randint(0, 2**62, (), generator=self._seed_source))
                        for _ in range(req.params.n)
                    ]
                )
                seqs = [Seq(req, i, torch.Generator().manual_seed(seed)) for i, seed in enumerate(seeds)]
                req.unfinished = len(seqs)
                new_seqs.extend(seqs)
                rows.extend([row_of[(req.adapter, tuple(req.prompt))]] * len(seqs))
            self._take(new_seqs, logits[torch.tensor(rows)], updates)
            live.extend(new_seqs)
        self._running = live  # finished ones are compacted away at the start of the next step
        self.steps += 1
        return updates

    def _take(self, seqs: list[Seq], logits: torch.Tensor, updates: dict[Request, RequestUpdate]) -> None:
        forced = [s.forced_next() for s in seqs]
        result = sample(
            logits,
            [s.req.params for s in seqs],
            [s.generator for s in seqs],
            forced if any(f is not None for f in forced) else None,
        )
        version = self._version
        for row, seq in enumerate(seqs):
            token, lp, top = result.token_ids[row], result.logprobs[row], result.top[row]
            seq.tokens.append(token)
            seq.logprobs.append(lp)
            seq.tops.append(top)
            seq.versions.append(version)
            self.generated_tokens += 1
            update = updates.setdefault(seq.req, RequestUpdate())
            update.tokens.append(TokenEvent(seq.index, token, lp, top, version))
            self._check_stop(seq, token, updates)

    def _check_stop(self, seq: Seq, token: int, updates: dict[Request, RequestUpdate]) -> None:
        params = seq.req.params
        if not params.ignore_eos and token in self.eos_token_ids:
            self._finish(seq, "stop", None, updates)
        elif token in params.stop_token_ids:
            self._finish(seq, "stop", token, updates)
        elif params.stop and (hit := self._stop_string(seq)) is not None:
            self._finish(seq, "stop", hit, updates)
        elif len(seq.tokens) >= seq.req.max_tokens or seq.cached + 1 >= self.max_model_len:
            self._finish(seq, "length", None, updates)

    def _stop_string(self, seq: Seq) -> str | None:
        params = seq.req.params
        # A stop string of c characters spans at most 4c byte-level tokens: decode only that tail.
        window = 4 * max(len(s) for s in params.stop) + 4
        tail = self.tokenizer.decode(seq.tokens[-window:], skip_special_tokens=params.skip_special_tokens)
        return next((s for s in params.stop if s in tail), None)

    def _finish(
        self, seq: Seq, reason: FinishReason, stop: str | int | None, updates: dict[Request, RequestUpdate]
    ) -> None:
        params = seq.req.params
        text = self.tokenizer.decode(seq.tokens, skip_special_tokens=params.skip_special_tokens)
        if isinstance(stop, str):
            at = text.find(stop)
            if at >= 0:
                text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
        seq.done = True
        seq.req.unfinished -= 1
        choice = ChoiceResult(seq.index, seq.tokens, seq.logprobs, seq.tops, seq.versions, text, reason, stop)
        updates.setdefault(seq.req, RequestUpdate()).finished.append(choice)
