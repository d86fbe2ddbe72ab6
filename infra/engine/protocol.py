"""Request models of the vLLM-compatible OpenAI API subset the engine serves.

Field names and defaults follow vLLM's ``ChatCompletionRequest`` / ``CompletionRequest``, including
its extensions (``top_k``, ``stop_token_ids``, ``ignore_eos``, ``return_token_ids``,
``return_weight_versions``, ``add_special_tokens``, ``chat_template_kwargs`` …). Unknown fields are
accepted and ignored, as agents send all sorts of things. Responses are built as plain JSON by
``serving.py`` because their exact shape is the contract.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.engine.sampling import InvalidRequestError, SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    return_weight_versions: bool = False
    return_tokens_as_token_ids: bool = False

    @field_validator("stop", mode="after")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop strings")
        return value

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise InvalidRequestError(f"{name} is not supported by the embedded engine")
        if self.repetition_penalty not in (None, 1, 1.0):
            raise InvalidRequestError("repetition_penalty is not supported by the embedded engine")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            max_tokens=max_tokens,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            min_tokens=self.min_tokens,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class PromptPrefix(BaseModel):
    """Flywheel's extension (tokens-in): ``messages[:messages]`` are exactly a previous call's prompt
    (``prompt_token_ids``) and the reply it generated (``response_token_ids``, the last message, an
    assistant's). The engine then starts the prompt with those ids instead of re-rendering them, so a
    call that extends the previous one extends its token ids too (``serving.EngineServing.chat_prompt``)."""

    model_config = ConfigDict(extra="forbid")
    messages: int = Field(ge=1)
    prompt_token_ids: list[int] = Field(min_length=1)
    response_token_ids: list[int] = Field(min_length=1)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    prompt_prefix: PromptPrefix | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(max_tokens, logprobs)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True
    max_tokens: int | None = 16  # OpenAI's (and vLLM's) default for completions

    def to_sampling_params(self) -> SamplingParams:
        if self.echo:
            raise InvalidRequestError("echo is not supported by the embedded engine")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported by the embedded engine")
        return self.sampling_params(self.max_tokens, self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, one token list, or a list of either."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        if all(isinstance(p, int) for p in prompt):
            return [[int(p) for p in prompt if isinstance(p, int)]]
        return [p for p in prompt if isinstance(p, str | list)]


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    version: int = Field(ge=0)


class LoadAdapterRequest(BaseModel):
    """``POST /load_adapter``: a peft adapter directory served as ``name`` from now on (infra/engine/adapters.py)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)
    path: str
    version: int = Field(ge=0)
