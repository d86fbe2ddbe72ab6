"""Turn an episode's recorded calls into training transitions (docs/architecture.md, "Token-faithful capture" and
"Credit assignment").

- Each call yields one transition per choice: its prompt ids exactly as the engine reported them and
  the choice's generated ids with their behaviour logprobs. A call with ``n > 1`` yields ``n``. A call
  that batched several prompts carries each choice's own prompt ids (``CallChoice.prompt_token_ids``);
  a choice's transition starts from those, never from another prompt's.
- Consecutive calls merge into one trajectory only when the extension property holds exactly: the next
  prompt ids start with the trajectory's prompt + response ids. The tokens between (tool results, the
  next user turn, template glue) become observation tokens: mask 0, logprob 0.0. Anything else starts a
  new transition and counts a ``prefix_mismatch``; ids are never spliced.
- Temperature: a transition's behaviour logprobs are of one sampling distribution, softmax(logits / T),
  and it carries that ``T`` (the call's recorded ``temperature``; 1.0 when not recorded) for the trainer
  to divide its logits by. A call sampled at another temperature than the trajectory's never extends
  it: it starts a new transition (not a ``prefix_mismatch``: its prompt may well extend the other).
- Policies: a call served by a LoRA adapter (``LLMCallRecorded.adapter``, infra/policies.py) gives
  transitions of that policy (``Transition.policy``) whose ``weight_version`` is the adapter's version;
  a call of another policy never extends the trajectory (as with temperature, not a mismatch).
- Rewards: the episode reward lands on the last call; per-call rewards (``RewardReported`` with a
  ``call_seq``) land on their call. A transition ending at call ``b`` gets its own calls' per-call
  rewards plus the discounted return from ``b`` on: ``Σ_{c ≥ b} γ^(c−b) r[c]``. With ``γ = 1`` and no
  per-call rewards every transition carries the episode reward.
- Per-segment returns: a merged trajectory holds several calls, so one number cannot say which of its
  calls did well. Each transition also carries, per call it holds (aligned with ``call_seqs``),
  ``segment_starts[k]`` — the index in ``response_ids`` where call ``k``'s generated tokens begin (its
  segment runs to the next start: its generated tokens, then the observation before the next call) —
  and ``segment_returns[k] = G[call_seqs[k]] = Σ_{c ≥ call_seqs[k]} γ^(c − call_seqs[k]) r[c]``. The
  trainer turns these into per-token advantages (:mod:`trainer.credit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas import CallChoice, LLMCallRecorded, LogprobsMode, Transition


@dataclass(slots=True)
class _Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    call_seqs: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # where each call's generated tokens begin
    weight_version: int = 0
    logprobs_mode: LogprobsMode = LogprobsMode.processed
    prompt_version: str | None = None  # one per episode: the gateway pins it per group (gateway/prompts.py)
    temperature: float = 1.0  # every call merged into it was sampled at this temperature
    policy: str | None = None  # the adapter every call merged into it was served by (None: the base)
    tokenizer: str | None = None  # the fingerprint of the tokenizer that made its ids (the first call's)

    def full(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_choice(self, call: LLMCallRecorded, choice: CallChoice) -> None:
        ids = choice.token_ids or []
        self.starts.append(len(self.response_ids))
        self.response_ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(choice.logprobs or [])
        self.call_seqs.append(call.call_seq)
        self.weight_version = min(self.weight_version, _version(call, choice))


@dataclass(slots=True)
class Assembly:
    transitions: list[Transition]
    prefix_mismatches: int = 0
    upstream_errors: int = 0
    no_token_ids: int = 0
    no_logprobs: int = 0
    usable_calls: int = 0

    def unusable_reason(self, num_calls: int) -> str | None:
        if self.transitions:
            return None
        if num_calls == 0:
            return "no_calls"
        counts = {
            "upstream_errors": self.upstream_errors,
            "no_token_ids": self.no_token_ids,
            "no_logprobs": self.no_logprobs,
        }
        worst = max(counts, key=lambda k: counts[k])
        return worst if counts[worst] else "no_usable_calls"


def _version(call: LLMCallRecorded, choice: CallChoice) -> int:
    if call.adapter is not None:  # the base is frozen while adapters train: the adapter's version counts
        return call.adapter_version or 0
    versions = [call.weight_version, *(choice.weight_versions or [])]
    return min(versions)


def _prompt(call: LLMCallRecorded, choice: CallChoice) -> list[int] | None:
    """The prompt ids this choice was generated from: its own (batched prompts), else the call's."""
    return choice.prompt_token_ids if choice.prompt_token_ids is not None else call.prompt_token_ids


def _temperature(call: LLMCallRecorded) -> float:
    """What the call's behaviour logprobs are of: unrecorded (older events), 1.0, as the trainer assumed;
    a greedy 0 (the gateway records 1.0 for it), 1.0, as engines report greedy logprobs unscaled."""
    t = call.temperature
    return t if t is not None and t >= 1e-5 else 1.0


def _problem(call: LLMCallRecorded, choice: CallChoice) -> str | None:
    if _prompt(call, choice) is None or choice.token_ids is None:
        return "no_token_ids"
    if choice.logprobs is None or len(choice.logprobs) != len(choice.token_ids):
        return "no_logprobs"
    return None


def _start(call: LLMCallRecorded, choice: CallChoice) -> _Trajectory:
    traj = _Trajectory(
        prompt_ids=list(_prompt(call, choice) or []),
        weight_version=_version(call, choice),
        logprobs_mode=call.logprobs_mode,
        prompt_version=call.prompt_version,
        temperature=_temperature(call),
        policy=call.adapter,
        tokenizer=call.tokenizer,
    )
    traj.add_choice(call, choice)
    return traj


def assemble(
    calls: Sequence[LLMCallRecorded],
    *,
    reward: float,
    call_rewards: dict[int, float] | None = None,
    discount: float = 1.0,
) -> Assembly:
    """Transitions of one episode from its calls (any order; sorted by ``call_seq``, duplicates dropped)."""
    ordered = sorted({c.call_seq: c for c in calls}.values(), key=lambda c: c.call_seq)
    closed: list[_Trajectory] = []
    open_: list[_Trajectory] = []  # the trajectories the next call may extend (one per previous choice)
    out = Assembly(transitions=[])
    for call in ordered:
        if call.error is not None or call.status_code >= 400 or not call.choices:
            out.upstream_errors += 1
            continue
        choices = sorted(call.choices, key=lambda ch: ch.index)
        problems = [p for p in (_problem(call, ch) for ch in choices) if p]
        if problems:
            if "no_token_ids" in problems:
                out.no_token_ids += 1
            else:
                out.no_logprobs += 1
            continue
        out.usable_calls += 1
        prompt = _prompt(call, choices[0]) or []
        extended: _Trajectory | None = None
        if len(choices) == 1:
            for traj in open_:
                full = traj.full()
                same_distribution = traj.temperature == _temperature(call) and traj.policy == call.adapter
                if same_distribution and len(prompt) >= len(full) and prompt[: len(full)] == full:
                    extended = traj
                    break
        if open_ and extended is None and not _extends_any(prompt, open_):
            out.prefix_mismatches += 1
        for traj in open_:
            if traj is not extended:
                closed.append(traj)
        if extended is not None:
            observation = prompt[len(extended.full()) :]
            extended.response_ids.extend(observation)
            extended.mask.extend([0] * len(observation))
            extended.logprobs.extend([0.0] * len(observation))
            extended.add_choice(call, choices[0])
            open_ = [extended]
        else:
            open_ = [_start(call, ch) for ch in choices]
    closed.extend(open_)
    closed.sort(key=lambda t: (t.call_seqs[0], t.call_seqs[-1]))
    last_seq = ordered[-1].call_seq if ordered else 0
    returns = _returns(last_seq, reward, call_rewards or {}, discount)
    for traj in closed:
        own = sum((call_rewards or {}).get(seq, 0.0) for seq in traj.call_seqs[:-1])
        out.transitions.append(
            Transition(
                prompt_ids=traj.prompt_ids,
                response_ids=traj.response_ids,
                response_mask=traj.mask,
                behaviour_logprobs=traj.logprobs,
                weight_version=traj.weight_version,
                call_seqs=traj.call_seqs,
                reward=returns[traj.call_seqs[-1]] + own,
                logprobs_mode=traj.logprobs_mode,
                prompt_version=traj.prompt_version,
                temperature=traj.temperature,
                policy=traj.policy,
                tokenizer=traj.tokenizer,
                segment_starts=traj.starts,
                segment_returns=[returns[seq] for seq in traj.call_seqs],
            )
        )
    return out


def _extends_any(prompt: list[int], open_: list[_Trajectory]) -> bool:
    """An n>1 call after open trajectories: not a mismatch when it continues one of them."""
    for traj in open_:
        full = traj.full()
        if prompt[: len(full)] == full:
            return True
    return False


def _returns(
    last_seq: int, reward: float, call_rewards: dict[int, float], discount: float
) -> dict[int, float]:
    """``G[c] = Σ_{c' ≥ c} γ^(c'−c) r[c']`` with the episode reward added to the last call."""
    r = dict(call_rewards)
    r[last_seq] = r.get(last_seq, 0.0) + reward
    returns: dict[int, float] = {}
    running = 0.0
    for seq in range(max([last_seq, *r]), -1, -1):
        running = r.get(seq, 0.0) + discount * running
        returns[seq] = running
    return returns
