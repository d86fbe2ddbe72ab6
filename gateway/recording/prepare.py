"""What the gateway adds to a request before it goes upstream, and how its prompts lay out over the
response's choices.

A token-faithful upstream (vLLM, the embedded engine) is asked for the prompt and completion ids and
logprobs of every call (``prepare_body``); :class:`Asked` remembers what the client itself asked for, so
``gateway.recording.capture.strip_response`` can take the rest away again. ``sampling_temperature`` is
the temperature those logprobs are of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from schemas.events import UpstreamKind

Endpoint = Literal["chat.completions", "completions"]


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """How a request's prompts map onto its response's choices: ``index = prompt_i * n + j``."""

    prompts: int  # how many prompts the request carries (chat: 1)
    n: int  # choices per prompt
    ids: tuple[list[int] | None, ...] = ()  # per prompt: the ids it was sent as, None for text

    @property
    def batched(self) -> bool:
        return self.prompts != 1


SINGLE = PromptLayout(prompts=1, n=1, ids=(None,))


def prompt_layout(data: dict[str, Any], endpoint: Endpoint) -> PromptLayout:
    """The prompts of a (validated) request body: one for chat, one or a list for completions."""
    n = data.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    prompt = data.get("prompt") if endpoint == "completions" else None
    if not isinstance(prompt, list):
        return PromptLayout(prompts=1, n=n, ids=(None,))
    if prompt and ints(prompt) is not None:  # one prompt given as token ids
        return PromptLayout(prompts=1, n=n, ids=(prompt,))
    return PromptLayout(
        prompts=len(prompt), n=n, ids=tuple(p if isinstance(p, list) else None for p in prompt)
    )


@dataclass(frozen=True, slots=True)
class Asked:
    """What the client itself asked for (so the gateway's additions can be stripped)."""

    logprobs: bool
    token_ids: bool
    weight_versions: bool


def prepare_body(
    data: dict[str, Any], endpoint: Endpoint, kind: UpstreamKind, *, weight_versions: bool
) -> tuple[dict[str, Any], Asked]:
    """The body sent upstream: the client's own plus ids and logprobs for token-faithful upstreams."""
    asked = Asked(
        logprobs=bool(data.get("logprobs")) or (endpoint == "completions" and data.get("logprobs") == 0),
        token_ids=data.get("return_token_ids") is True,
        weight_versions=data.get("return_weight_versions") is True,
    )
    if kind is UpstreamKind.openai:
        return data, asked
    body = dict(data)
    body["return_token_ids"] = True
    if endpoint == "chat.completions":
        body["logprobs"] = True
    elif not isinstance(data.get("logprobs"), int) or isinstance(data.get("logprobs"), bool):
        body["logprobs"] = 0
    if weight_versions or kind is UpstreamKind.embedded:
        body["return_weight_versions"] = True
    return body, asked


GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS and the embedded engine's GREEDY_EPS


def sampling_temperature(body: dict[str, Any], kind: UpstreamKind) -> float | None:
    """The temperature the engine's processed logprobs are of, from the body sent upstream.

    The request's ``temperature``; absent, the engine's default: 1.0 for the embedded engine
    (infra/engine/protocol.py) and for vLLM as Flywheel starts it (``--generation-config vllm``, so
    no model's ``generation_config.json`` sets another); a text-only upstream's is not known (None).
    A greedy request (below ``GREEDY_BELOW``) records 1.0: vLLM (``Sampler.sample``, all-greedy or
    mixed batches) and the embedded engine (``processed_logprobs``) both report its logprobs unscaled.
    """
    value = body.get("temperature")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None if kind is UpstreamKind.openai else 1.0
    return 1.0 if value < GREEDY_BELOW else float(value)


def ints(value: Any) -> list[int] | None:
    # the element types collected at C speed: this runs on every id list of every call
    if isinstance(value, list) and set(map(type, value)) <= {int}:
        return value
    return None
