"""Forced outputs, for tests only: make the engine emit given tokens instead of sampling them.

A tiny random model never writes a tool call, yet an end-to-end test of a framework's tool loop needs
one, deterministically, through the real engine, gateway and capture. ``InferenceEngine(...,
forced_output=f)`` calls ``f(prompt_ids)`` once per request; when it returns token ids, each choice
emits exactly those ids (then samples normally, should the forced ids not end with an end-of-turn
token). Everything else is the engine's: the model still runs every step, each forced token's logprob
and top alternatives are read from the same processed distribution a sampled token's would be
(sampling.py), so what is recorded is what the model computed for the emitted tokens — only the choice
of token is scripted. Nothing in the serving path or the CLI sets this: a test builds the engine with it.

``scripted_replies(tokenizer, script)`` adapts a text-level script: ``script(prompt_text)`` returns the
reply text to force (or ``None`` to sample), encoded with the serving tokenizer plus its end-of-turn
token — which is exactly what a model that learnt to write that reply would emit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

ForcedOutput = Callable[[Sequence[int]], Sequence[int] | None]


def scripted_replies(tokenizer: Any, script: Callable[[str], str | None]) -> ForcedOutput:
    """A ``ForcedOutput`` from a function of the decoded prompt (special tokens kept) to a reply."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token to end a scripted reply with")

    def forced(prompt_ids: Sequence[int]) -> list[int] | None:
        reply = script(tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        if reply is None:
            return None
        return [*(int(t) for t in tokenizer.encode(reply, add_special_tokens=False)), int(eos)]

    return forced
