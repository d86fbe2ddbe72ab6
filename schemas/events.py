"""Every event that travels on the bus, one pydantic model each, grouped by topic.

Topic → events (docs/architecture.md, "Topics and events"):
    flywheel.tasks        RolloutRequested, RolloutCancelled                      key: task_id
    flywheel.episodes     EpisodeStarted, LLMCallRecorded, RewardReported,
                          EpisodeFinished, AgentSpansRecorded                     key: episode_id
    flywheel.transitions  EpisodeScored                                           key: group_id
    flywheel.control      WeightUpdateRequested, InferenceDrained, WeightsActivated,
                          InferenceResumed, WeightUpdateFailed, TrainerStepCompleted,
                          TrainerPauseRequested, TrainerResumeRequested, PromptVersion-
                          {Requested,Activated}, Version{Proposed,Evaluated,Promoted,
                          RolledBack,Pinned}                                      key: model
    flywheel.deadletter   DeadLetter                                              key: original key

Events of topics with a module of their own (tasks, control, spans) are imported for the unions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from schemas.common import (
    AgentRef,
    EpisodeSource,
    EpisodeStatus,
    EventBase,
    Mode,
    Reward,
    Task,
    TokenLogprob,
)
from schemas.control import (
    InferenceDrained,
    InferenceResumed,
    PromptVersionActivated,
    PromptVersionRequested,
    ReleaseEvent,
    TrainerPauseRequested,
    TrainerResumeRequested,
    TrainerStepCompleted,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from schemas.spans import AgentSpansRecorded
from schemas.tasks import RolloutCancelled, RolloutRequested

# ------------------------------------------------------------------------------------ episodes


class EpisodeStarted(EventBase):
    """An episode exists: a training rollout (opened by a worker) or a production session."""

    type: Literal["episode_started"] = "episode_started"
    episode_id: str = Field(min_length=1, max_length=64)
    source: EpisodeSource = EpisodeSource.live
    mode: Mode = Mode.train
    model: str = Field(default="policy", max_length=256)
    task: Task | None = None
    agent: AgentRef | None = None
    group_id: str | None = Field(default=None, max_length=64)
    group_size: int = Field(default=1, ge=1)
    attempt: int = Field(default=0, ge=0)
    tenant: str | None = Field(default=None, max_length=128)
    session_id: str | None = Field(default=None, max_length=256)
    deadline_at: datetime | None = None
    sample_index: int = Field(default=0, ge=0, description="which member of the group (added, optional)")

    @property
    def task_id(self) -> str | None:
        return self.task.task_id if self.task is not None else None


class UpstreamKind(StrEnum):
    vllm = "vllm"  # reports token ids and logprobs
    embedded = "embedded"  # Flywheel's in-process engine; same capabilities as vllm
    openai = "openai"  # generic OpenAI-compatible server: text only


class LogprobsMode(StrEnum):
    processed = "processed_logprobs"  # after temperature/top-p: matches the sampling distribution
    raw = "raw_logprobs"  # before sampling transforms
    none = "none"


class CallChoice(BaseModel):
    """One generated choice, as the engine reported it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    text: str = ""
    message: JsonValue = None  # chat: the assistant message as returned (tool_calls included)
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # behaviour log-probability of each generated token
    top_logprobs: list[list[TokenLogprob]] | None = None
    weight_versions: list[int] | None = None  # per token, where the engine reports it
    prompt_token_ids: list[int] | None = Field(
        default=None,
        description="the prompt ids of this choice, set only when the call batched several prompts "
        "(``/v1/completions`` with a list of prompts); otherwise the call's ``prompt_token_ids`` apply "
        "(added, optional)",
    )


class PromptSubstitution(BaseModel):
    """One piece of a call's prompt the gateway replaced before the engine saw it (gateway/prompts.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    component: str = Field(min_length=1, max_length=128)
    message_index: int | None = Field(default=None, ge=0, description="chat: which message; None: the prompt")
    original: str = Field(description="the text the agent sent")
    substituted: str = Field(description="the text the model saw instead")


class LLMCallRecorded(EventBase):
    """One LLM call through the gateway, token-faithful when the upstream reports ids."""

    type: Literal["llm_call_recorded"] = "llm_call_recorded"
    episode_id: str = Field(min_length=1, max_length=64)
    call_seq: int = Field(ge=0)
    call_id: str = Field(min_length=1, max_length=64)
    source: EpisodeSource = EpisodeSource.live
    tenant: str | None = None
    endpoint: Literal["chat.completions", "completions", "responses", "messages"] = Field(
        default="chat.completions",
        description="the protocol the agent spoke: the OpenAI Responses API and Anthropic's Messages API are "
        "served as one chat call each, whose ids these are; request and response as the agent sent and got "
        "them (added: responses, messages)",
    )
    model: str = ""
    request: str = Field(description="the request body as the agent sent it (JSON text)")
    response: str | None = Field(default=None, description="the response body (assembled if streamed)")
    status_code: int = 200
    error: str | None = None
    streamed: bool = False
    upstream: UpstreamKind = UpstreamKind.vllm
    upstream_url: str = ""
    logprobs_mode: LogprobsMode = LogprobsMode.processed
    token_faithful: bool = Field(
        default=False,
        description="prompt and every choice carry token ids (for a batched call: every choice carries "
        "the ids of its own prompt)",
    )
    prompt_token_ids: list[int] | None = Field(
        default=None,
        description="the prompt's ids; None for a batched call (see CallChoice.prompt_token_ids)",
    )
    choices: list[CallChoice] = Field(default_factory=list)
    tokenizer: str | None = Field(
        default=None,
        max_length=64,
        description="the fingerprint of the tokenizer that made the ids (infra/tokenizer_fingerprint.py); "
        "None: not known (added, optional)",
    )
    weight_version: int = Field(default=0, ge=0)
    weight_version_source: Literal["engine", "gateway"] | None = Field(
        default=None,
        description="'engine': every choice carries the engine's per-token weight_versions; 'gateway': "
        "the engine reported none (vLLM < 0.33 on /v1), and weight_version is the version the gateway "
        "admitted the call under, which a drained weight update keeps exact; None: not known (added, "
        "optional)",
    )
    extends_previous: bool | None = Field(
        default=None, description="prompt = previous prompt + previous response (None: first call/unknown)"
    )
    prefix_mismatch: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    started_at: datetime | None = None
    prompt_version: str | None = Field(
        default=None,
        max_length=64,
        description="the optimised prompt version the gateway substituted into this call; None: the "
        "agent's own prompt (added, optional)",
    )
    prompt_substitutions: list[PromptSubstitution] = Field(
        default_factory=list,
        description="every change the gateway made to the prompt, original and substituted text; the "
        "prompt ids are those of the substituted prompt, what the model saw (added, optional)",
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        description="the temperature the behaviour logprobs are of: the engine divided the logits by it "
        "before the softmax (processed logprobs). The request's temperature, else the engine's default "
        "(1.0: the embedded engine's, and vLLM's as Flywheel starts it, ``--generation-config vllm``); "
        "1.0 for a greedy request (temperature 0), whose logprobs engines report unscaled. None: not "
        "known (events before this field; a text-only upstream whose default is not known) (added, "
        "optional)",
    )
    adapter: str | None = Field(
        default=None,
        max_length=128,
        description="the LoRA adapter (policy) that served the call over the base, chosen by the policy "
        "map (infra/policies.py); None: the base alone (added, optional)",
    )
    adapter_version: int | None = Field(
        default=None,
        ge=0,
        description="the adapter's own version when the gateway admitted the call; weight_version stays "
        "the base's (added, optional)",
    )


class RewardOrigin(StrEnum):
    agent = "agent"  # the agent reported it (gateway reward route or final JSON line)
    feedback = "feedback"  # production user feedback
    judge = "judge"


class RewardReported(EventBase):
    type: Literal["reward_reported"] = "reward_reported"
    episode_id: str = Field(min_length=1, max_length=64)
    value: Reward | None = None
    call_seq: int | None = Field(default=None, ge=0)
    call_id: str | None = None
    origin: RewardOrigin = RewardOrigin.agent
    message: str = Field(default="", max_length=8192)
    rating: int | None = Field(default=None, description="production feedback: e.g. -1/+1 or 1..5")
    tenant: str | None = None


class EpisodeFinished(EventBase):
    type: Literal["episode_finished"] = "episode_finished"
    episode_id: str = Field(min_length=1, max_length=64)
    status: EpisodeStatus
    output: JsonValue = None
    error: str | None = Field(default=None, max_length=16384)
    reported_reward: Reward | None = None
    num_calls: int | None = None
    duration_s: float = 0.0
    task_id: str | None = None
    group_id: str | None = None
    attempt: int = 0
    source: EpisodeSource = EpisodeSource.live
    tenant: str | None = None
    sample_index: int = Field(default=0, ge=0, description="which member of the group (added, optional)")
    superseded: bool = Field(
        default=False,
        description="another episode replaces this one for its group member (a retry, a handed-back or "
        "redelivered task): do not count it toward the group (added, optional)",
    )


EpisodeEvent = Annotated[
    EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished | AgentSpansRecorded,
    Field(discriminator="type"),
]

# --------------------------------------------------------------------------------- transitions


class Transition(BaseModel):
    """One training sample: a prompt and a response, possibly several calls merged into one trajectory.

    ``response_mask`` is 1 on tokens the policy generated and 0 on observation tokens spliced in
    between merged calls; ``behaviour_logprobs`` has one entry per response token (0.0 where masked).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    behaviour_logprobs: list[float]
    weight_version: int = Field(default=0, ge=0, description="oldest version among the merged calls")
    call_seqs: list[int] = Field(default_factory=list)
    reward: Reward = 0.0
    logprobs_mode: LogprobsMode = LogprobsMode.processed
    prompt_version: str | None = Field(
        default=None,
        max_length=64,
        description="the prompt version its calls were served under (added, optional)",
    )
    tokenizer: str | None = Field(
        default=None,
        max_length=64,
        description="the fingerprint of the tokenizer that made its ids, from its calls (added, optional)",
    )
    segment_starts: list[int] | None = Field(
        default=None,
        description="per call in call_seqs: index in response_ids where its generated tokens begin "
        "(added, optional)",
    )
    segment_returns: list[Reward] | None = Field(
        default=None,
        description="per call in call_seqs: the discounted return from that call on, per-call rewards "
        "included (added, optional)",
    )
    temperature: float = Field(
        default=1.0,
        gt=0,
        description="the sampling temperature its behaviour logprobs are of; the trainer divides the "
        "logits by it before the softmax, so its ratios compare like with like. Calls at different "
        "temperatures are never merged into one transition (added, optional)",
    )
    policy: str | None = Field(
        default=None,
        max_length=128,
        description="the policy (LoRA adapter) its calls were served by and that trains on it; calls of "
        "different policies are never merged into one transition; weight_version is then the adapter's "
        "version. None: the shared policy (added, optional)",
    )


class EpisodeScored(EventBase):
    """A scored episode with its transitions, ready for the trainer (or why it has none)."""

    type: Literal["episode_scored"] = "episode_scored"
    episode_id: str = Field(min_length=1, max_length=64)
    group_id: str = Field(min_length=1, max_length=64)
    group_size: int = Field(default=1, ge=1)
    task_id: str | None = None
    attempt: int = 0
    source: EpisodeSource = EpisodeSource.live
    mode: Mode = Mode.train
    model: str = "policy"
    tenant: str | None = None
    status: EpisodeStatus = EpisodeStatus.ok
    reward: Reward | None = None
    reward_source: str = Field(default="", description="agent | filled | scorer name | feedback | judge")
    score_error: str | None = None
    num_calls: int = 0
    context_calls: int = Field(
        default=0,
        ge=0,
        description="recorded calls the training selector kept out of the transitions: context only "
        "(--train-models / train_system_match; added, optional)",
    )
    prefix_mismatches: int = 0
    transitions: list[Transition] = Field(default_factory=list)
    unusable_reason: str | None = Field(
        default=None, description="why there are no usable transitions (no_calls, no_token_ids, ...)"
    )
    finished_at: datetime | None = None
    sample_index: int = Field(default=0, ge=0, description="which member of the group (added, optional)")
    superseded: bool = Field(
        default=False,
        description="another episode replaces this one for its group member (a retry, a handed-back or "
        "redelivered task): do not count it toward the group (added, optional)",
    )
    score_revision: int = Field(
        default=0,
        ge=0,
        description="0 for an episode's first score; each re-score (feedback that arrived after scoring) "
        "publishes the same episode again with a higher revision, which supersedes the lower ones "
        "(added, optional)",
    )
    score_note: str | None = Field(
        default=None,
        max_length=8192,
        description="the scorer's reason for the reward in words (e.g. what was expected), the feedback "
        "prompt optimisation reflects on (added, optional)",
    )
    recorded_source: EpisodeSource | None = Field(
        default=None,
        description="on a replayed episode (source=replay): the source it was recorded with, so a replayed "
        "production session is trained as one, against its tenant's baseline (added, optional)",
    )


# ---------------------------------------------------------------------------------- deadletter


# ------------------------------------------------------------------------ agent lightning (added)


class AglRecorded(EventBase):
    """One change to Agent Lightning state served by ``flywheel agl-server`` (added, optional).

    ``kind``: ``rollout_created`` | ``rollout_patched`` | ``rollout_deleted`` | ``event`` |
    ``models_registered`` | ``models_cleared`` | ``paused`` | ``resumed``; ``data`` is the AGL object
    as the server answered it. Model calls travel as ``LLMCallRecorded`` on ``flywheel.episodes`` too.
    """

    type: Literal["agl_recorded"] = "agl_recorded"
    scope: str = Field(min_length=1, max_length=64, description="partition key: tenant + rollout digest")
    tenant: str = Field(default="default", max_length=128)
    kind: str = Field(min_length=1, max_length=64)
    rollout_id: str | None = None  # the caller's own id, any length (AGL sets no limit)
    attempt_id: str | None = None
    episode_id: str | None = Field(default=None, max_length=64)
    data: JsonValue = None


class DeadLetter(EventBase):
    """A message a consumer could not process, with where it came from and why."""

    type: Literal["dead_letter"] = "dead_letter"
    original_topic: str
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    consumer_group: str = ""
    error_type: str = ""
    error: str = Field(default="", max_length=16384)
    attempts: int = 1
    payload: str = Field(
        default="",
        description="the original message as text (utf-8); when it is not faithful text, or too large, "
        "a preview (see payload_base64)",
    )
    payload_base64: str = Field(
        default="",
        description="the original bytes, base64, when payload is not them exactly (invalid utf-8, "
        "control bytes, too large); cut to fit the broker when payload_truncated (added, optional)",
    )
    payload_size: int = Field(default=0, ge=0, description="bytes of the original message (added, optional)")
    payload_sha256: str = Field(
        default="", description="sha256 of the whole original message (added, optional)"
    )
    payload_truncated: bool = Field(
        default=False, description="the original did not fit the broker and was cut (added, optional)"
    )


AnyEvent = (
    RolloutRequested
    | RolloutCancelled
    | EpisodeStarted
    | LLMCallRecorded
    | RewardReported
    | EpisodeFinished
    | EpisodeScored
    | WeightUpdateRequested
    | InferenceDrained
    | WeightsActivated
    | InferenceResumed
    | WeightUpdateFailed
    | TrainerStepCompleted
    | TrainerPauseRequested
    | TrainerResumeRequested
    | PromptVersionRequested
    | PromptVersionActivated
    | ReleaseEvent
    | AglRecorded
    | AgentSpansRecorded
    | DeadLetter
)
"""Any event of any topic, for type hints (the order is the order of the JSON schema's ``oneOf``)."""

Event = Annotated[AnyEvent, Field(discriminator="type")]
"""The same union, discriminated by ``type``: what a validator of any event is built on."""
