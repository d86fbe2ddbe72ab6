from __future__ import annotations

import asyncio

import pytest
import torch

from infra.engine import InferenceEngine, InvalidRequestError, SamplingParams, WeightLoadError
from infra.engine.sampling import processed_logprobs

pytestmark = pytest.mark.timeout(120)  # the first test also pays for importing torch + transformers


def _hf_logits(engine: InferenceEngine, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return engine.model(torch.tensor([ids])).logits[0].float()


def test_runner_matches_hf_forward(engine: InferenceEngine, chat_ids: list[int]) -> None:
    runner = engine.runner
    other = chat_ids[:7]
    runner.reserve(2, 64)
    first = runner.prefill(chat_ids, 0)
    runner.prefill(other, 1)
    ref_a, ref_b = _hf_logits(engine, [*chat_ids, 5, 9]), _hf_logits(engine, [*other, 11, 3])
    assert torch.allclose(first, ref_a[len(chat_ids) - 1], atol=1e-4)
    step1 = runner.decode([5, 11], [len(chat_ids), len(other)])
    step2 = runner.decode([9, 3], [len(chat_ids) + 1, len(other) + 1])
    assert torch.allclose(step1[0], ref_a[len(chat_ids)], atol=1e-4)
    assert torch.allclose(step1[1], ref_b[len(other)], atol=1e-4)
    assert torch.allclose(step2[0], ref_a[len(chat_ids) + 1], atol=1e-4)
    assert torch.allclose(step2[1], ref_b[len(other) + 1], atol=1e-4)


PARAMS = [
    SamplingParams(max_tokens=24, seed=1, ignore_eos=True),
    SamplingParams(max_tokens=17, seed=2, temperature=0.7, top_p=0.8, ignore_eos=True),
    SamplingParams(max_tokens=30, seed=3, temperature=1.3, top_k=20, ignore_eos=True),
    SamplingParams(max_tokens=12, seed=4, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=20, seed=5, temperature=0.9, top_k=40, top_p=0.9, ignore_eos=True, logprobs=3),
]


async def test_batched_requests_match_single_requests_under_a_seed(
    engine: InferenceEngine, chat_ids: list[int]
) -> None:
    prompts = [chat_ids, chat_ids[:9], chat_ids[3:], chat_ids, chat_ids[:-2]]
    alone = [await engine.complete(p, sp) for p, sp in zip(prompts, PARAMS, strict=True)]
    steps_alone = engine.steps
    together = await asyncio.gather(*(engine.complete(p, sp) for p, sp in zip(prompts, PARAMS, strict=True)))
    assert engine.steps - steps_alone < sum(sp.max_tokens or 0 for sp in PARAMS) / 2  # really batched
    for a, b in zip(alone, together, strict=True):
        assert a.choices[0].token_ids == b.choices[0].token_ids
        assert a.choices[0].logprobs == pytest.approx(b.choices[0].logprobs, abs=1e-5)


async def test_logprobs_are_the_sampling_distributions_and_match_a_teacher_forced_recompute(
    engine: InferenceEngine, chat_ids: list[int]
) -> None:
    for sp in PARAMS:
        result = await engine.complete(chat_ids, sp)
        out = result.choices[0]
        logits = _hf_logits(engine, chat_ids + out.token_ids)[len(chat_ids) - 1 : -1]
        n = len(out.token_ids)
        recomputed = processed_logprobs(
            logits,
            torch.full((n,), sp.temperature),
            torch.full((n,), max(sp.top_k, 0), dtype=torch.long),
            torch.full((n,), sp.top_p),
        )
        expected = recomputed.gather(1, torch.tensor(out.token_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-5), sp
        assert all(torch.isfinite(expected))  # the sampled token always has positive probability
        if sp.logprobs:
            top = recomputed.topk(sp.logprobs, dim=-1)
            assert [[t for t, _ in alts] for alts in out.top_logprobs] == top.indices.tolist()
        if sp.top_k and sp.top_k > 0:  # the processed distribution really is truncated
            assert int(torch.isfinite(recomputed[0]).sum()) <= sp.top_k


async def test_stop_strings_and_stop_token_ids(engine: InferenceEngine, chat_ids: list[int]) -> None:
    base = SamplingParams(max_tokens=40, seed=7, ignore_eos=True)
    full = (await engine.complete(chat_ids, base)).choices[0]
    text = full.text
    start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    cut = text.find(stop)
    got = (
        await engine.complete(chat_ids, SamplingParams(max_tokens=40, seed=7, ignore_eos=True, stop=(stop,)))
    ).choices[0]
    assert (got.finish_reason, got.stop_reason, got.text) == ("stop", stop, text[:cut])
    assert got.token_ids == full.token_ids[: len(got.token_ids)]
    kept = SamplingParams(
        max_tokens=40, seed=7, ignore_eos=True, stop=(stop,), include_stop_str_in_output=True
    )
    assert (await engine.complete(chat_ids, kept)).choices[0].text == text[: cut + len(stop)]

    target = full.token_ids[5]
    first = full.token_ids.index(target)
    by_id = SamplingParams(max_tokens=40, seed=7, ignore_eos=True, stop_token_ids=(target,))
    got = (await engine.complete(chat_ids, by_id)).choices[0]
    assert (got.finish_reason, got.stop_reason) == ("stop", target)
    assert got.token_ids == full.token_ids[: first + 1]


async def test_eos_stops_unless_ignored(engine: InferenceEngine, chat_ids: list[int]) -> None:
    eos = next(iter(engine.eos_token_ids))
    biased = SamplingParams(max_tokens=10, seed=0, stop_token_ids=(), temperature=0.0)
    with torch.no_grad():  # make EOS the greedy choice everywhere
        engine.model.lm_head.weight[eos] += 50.0
    got = (await engine.complete(chat_ids, biased)).choices[0]
    assert (got.token_ids, got.finish_reason, got.stop_reason, got.text) == ([eos], "stop", None, "")
    ignored = (
        await engine.complete(chat_ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    ).choices[0]
    assert (ignored.token_ids, ignored.finish_reason) == ([eos] * 4, "length")


async def test_n_choices_use_seed_plus_index(engine: InferenceEngine, chat_ids: list[int]) -> None:
    result = await engine.complete(chat_ids, SamplingParams(n=3, max_tokens=15, seed=10, ignore_eos=True))
    assert [c.index for c in result.choices] == [0, 1, 2]
    for i, choice in enumerate(result.choices):
        single = await engine.complete(chat_ids, SamplingParams(max_tokens=15, seed=10 + i, ignore_eos=True))
        assert choice.token_ids == single.choices[0].token_ids
    assert len({tuple(c.token_ids) for c in result.choices}) == 3


async def test_bad_requests_are_refused_clearly(engine: InferenceEngine, chat_ids: list[int]) -> None:
    with pytest.raises(InvalidRequestError, match="maximum context length"):
        await engine.complete(chat_ids, SamplingParams(max_tokens=1000))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        await engine.complete([10**6], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="empty"):
        await engine.complete([], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="top_p"):
        await engine.complete(chat_ids, SamplingParams(top_p=0.0))
    ok = await engine.complete(chat_ids, SamplingParams(max_tokens=3, ignore_eos=True))
    assert ok.choices[0].finish_reason == "length"


async def _tokens_seen(stream, count: int) -> list:  # type: ignore[no-untyped-def]
    seen = []
    async for update in stream:
        seen.append(update)
        if sum(len(u.tokens) for u in seen) >= count:
            return seen
    raise AssertionError("stream ended early")


async def test_pause_keep_freezes_and_resume_continues(engine: InferenceEngine, chat_ids: list[int]) -> None:
    stream = engine.generate(chat_ids, SamplingParams(max_tokens=60, seed=3, ignore_eos=True))
    await _tokens_seen(stream, 3)
    await engine.pause("keep")
    assert engine.is_paused
    steps = engine.steps
    late = asyncio.create_task(engine.complete(chat_ids, SamplingParams(max_tokens=5, ignore_eos=True)))
    await engine.wait_until(lambda: engine.num_waiting == 1)  # the late request is queued, not started
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert engine.steps == steps and engine.num_waiting == 1 and not late.done()
    await engine.resume()
    rest = [u async for u in stream]
    assert rest[-1].finished[0].finish_reason == "length"
    assert len(rest[-1].finished[0].token_ids) == 60
    assert (await late).choices[0].finish_reason == "length"


async def test_pause_abort_ends_inflight_and_wait_lets_them_finish(
    engine: InferenceEngine, chat_ids: list[int]
) -> None:
    stream = engine.generate(chat_ids, SamplingParams(max_tokens=200, seed=3, ignore_eos=True))
    await _tokens_seen(stream, 2)
    await engine.pause("abort")
    rest = [u async for u in stream]
    aborted = rest[-1].finished[0]
    assert aborted.finish_reason == "abort" and 2 <= len(aborted.token_ids) < 200
    await engine.resume()

    running = asyncio.create_task(engine.complete(chat_ids, SamplingParams(max_tokens=30, ignore_eos=True)))
    await engine.wait_until(lambda: engine.num_running == 1)
    await engine.pause("wait")
    assert running.done() and running.result().choices[0].finish_reason == "length"
    await engine.resume()


async def test_cancelled_request_frees_its_slot(engine: InferenceEngine, chat_ids: list[int]) -> None:
    stream = engine.generate(chat_ids, SamplingParams(max_tokens=200, ignore_eos=True))
    await _tokens_seen(stream, 2)
    await stream.aclose()
    other = await engine.complete(chat_ids, SamplingParams(max_tokens=4, ignore_eos=True))
    assert other.choices[0].finish_reason == "length"
    assert engine.num_running == 0


def _perturbed(engine: InferenceEngine, scale: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        name: p.detach() + scale * torch.randn(p.shape, generator=gen)
        for name, p in engine.model.named_parameters()
    }


async def test_load_weights_between_requests_changes_outputs_and_version(
    engine: InferenceEngine, chat_ids: list[int], tmp_path
) -> None:
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    before = (await engine.complete(chat_ids, greedy)).choices[0]
    assert set(before.weight_versions) == {0}
    await engine.load_weights(_perturbed(engine, 0.5), version=1)
    after = (await engine.complete(chat_ids, greedy)).choices[0]
    assert engine.weight_version == 1 and set(after.weight_versions) == {1}
    assert after.token_ids != before.token_ids

    engine.model.save_pretrained(tmp_path / "v1")  # the current (v1) weights, as a checkpoint on disk
    await engine.load_weights(_perturbed(engine, 0.5), version=2)
    assert (await engine.complete(chat_ids, greedy)).choices[0].token_ids != after.token_ids
    await engine.load_weights(tmp_path / "v1", version=3)
    again = (await engine.complete(chat_ids, greedy)).choices[0]
    assert again.token_ids == after.token_ids and set(again.weight_versions) == {3}


async def test_failed_weight_loads_keep_the_old_weights_serving(
    engine: InferenceEngine, chat_ids: list[int], tmp_path
) -> None:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    before = (await engine.complete(chat_ids, greedy)).choices[0].token_ids
    good = _perturbed(engine, 0.5)
    name = next(iter(good))
    broken: list[tuple[dict[str, torch.Tensor] | object, str]] = [
        ({k: v for k, v in good.items() if k != name}, "missing"),
        ({**good, name: torch.zeros(3, 3)}, "shape"),
        ({**good, name: torch.full_like(good[name], float("nan"))}, "NaN"),
        ({**good, "extra.weight": torch.zeros(1)}, "unexpected"),
        (tmp_path / "nowhere", "does not exist"),
    ]
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    broken.append((tmp_path / "junk.safetensors", "cannot read"))
    for source, message in broken:
        with pytest.raises(WeightLoadError, match=message):
            await engine.load_weights(source, version=9)  # type: ignore[arg-type]
        assert engine.weight_version == 0
    assert (await engine.complete(chat_ids, greedy)).choices[0].token_ids == before


@pytest.mark.parametrize(
    ("values", "finite"),
    [
        ([1.0, -2.0, 3.0], True),
        ([3e38, 3e38, 3e38], True),  # the sum overflows, every element is finite
        ([1.0, float("nan"), 2.0], False),
        ([1.0, float("inf"), 2.0], False),
        ([float("inf"), float("-inf")], False),  # the sum is NaN
        ([-float("inf")], False),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_weight_check_finds_every_non_finite_value(
    values: list[float], finite: bool, dtype: torch.dtype
) -> None:
    from infra.engine.weight_loading import _all_finite

    tensor = torch.tensor(values).to(dtype)  # 3e38 overflows to inf in fp16: ask torch what it holds
    assert _all_finite(tensor) is bool(torch.isfinite(tensor).all())
    if dtype == torch.float32:
        assert _all_finite(tensor) is finite


async def test_weights_loaded_mid_request_are_reported_per_token(
    engine: InferenceEngine, chat_ids: list[int]
) -> None:
    stream = engine.generate(chat_ids, SamplingParams(max_tokens=40, seed=1, ignore_eos=True))
    seen = await _tokens_seen(stream, 4)
    await engine.pause("keep")
    await engine.load_weights(_perturbed(engine, 0.1), version=7)
    await engine.resume()
    seen += [u async for u in stream]
    versions = seen[-1].finished[0].weight_versions
    assert versions[0] == 0 and versions[-1] == 7 and versions == sorted(versions)
    assert [t.weight_version for u in seen for t in u.tokens] == versions


async def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(
    engine: InferenceEngine, chat_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.engine import EngineStepError

    real = engine.runner.decode
    calls = {"n": 0}

    def flaky(tokens: list[int], positions: list[int]) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real(tokens, positions)

    monkeypatch.setattr(engine.runner, "decode", flaky)
    with pytest.raises(EngineStepError, match="simulated kernel failure"):
        await engine.complete(chat_ids, SamplingParams(max_tokens=10, ignore_eos=True))
    ok = await engine.complete(chat_ids, SamplingParams(max_tokens=5, ignore_eos=True))
    assert ok.choices[0].finish_reason == "length" and len(ok.choices[0].token_ids) == 5


async def test_pause_wait_after_keep_lets_frozen_requests_finish(
    engine: InferenceEngine, chat_ids: list[int]
) -> None:
    stream = engine.generate(chat_ids, SamplingParams(max_tokens=20, ignore_eos=True))
    await _tokens_seen(stream, 2)
    await engine.pause("keep")
    await asyncio.wait_for(engine.pause("wait"), timeout=30)
    rest = [u async for u in stream]
    assert rest[-1].finished[0].finish_reason == "length" and engine.is_paused
    await engine.resume()
