"""The embedded inference engine: continuous batching over a hand-written KV-cache decode loop.

One asyncio task schedules; every model computation runs on one dedicated worker thread (torch
releases the GIL, so the event loop keeps serving HTTP meanwhile). Each iteration, under the step
lock: finished sequences leave the batch, waiting requests join it (prefill + first token), and every
running sequence decodes one token in one batched forward. A request can therefore join or leave at
any token boundary (continuous batching), and throughput grows with concurrency.

Weight updates and pauses take the same step lock, so they happen between two steps: no step ever runs
on half-loaded weights, and every token reports the weight version that produced it.

Pause modes follow vLLM: ``abort`` ends in-flight requests now (``finish_reason="abort"``), ``wait``
returns once in-flight requests have finished, ``keep`` freezes them until ``resume()``. In every
mode, requests arriving while paused wait in the queue and start on ``resume()``.

Errors::

    EngineError
    ├── InvalidRequestError   (sampling.py; bad parameters or prompt; HTTP 400)
    ├── WeightLoadError       (weight_loading.py; old weights keep serving)
    ├── UnsupportedModelError (runner.py; raised at load)
    └── EngineStepError       (a model step failed; its requests fail, the engine keeps running)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from infra.engine.adapters import Adapter, check_adapter, read_adapter
from infra.engine.batch import BatchStepper, Request, Seq
from infra.engine.forcing import ForcedOutput
from infra.engine.outputs import (
    ChoiceResult,
    EngineStepError,
    FinishReason,
    GenerationResult,
    PauseMode,
    RequestUpdate,
    TokenEvent,
)
from infra.engine.runner import KVRunner, model_eos_ids
from infra.engine.sampling import InvalidRequestError, SamplingParams
from infra.engine.weight_loading import WeightLoadError, apply_state_dict, check_state_dict, read_state_dict

__all__ = [
    "ChoiceResult",
    "EngineStepError",
    "FinishReason",
    "GenerationResult",
    "InferenceEngine",
    "PauseMode",
    "RequestUpdate",
    "TokenEvent",
]


class InferenceEngine(BatchStepper):
    """Serve one causal LM with continuous batching; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        weight_version: int = 0,
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        forced_output: ForcedOutput | None = None,
    ) -> None:
        self.model = model.eval()
        self.forced_output = forced_output  # tests only: forcing.py
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.runner = KVRunner(model, max_model_len=max_model_len)
        self.max_model_len = self.runner.max_model_len
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else model_eos_ids(model, tokenizer)
        )
        self._version = weight_version
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting: deque[Request] = deque()
        self._running: list[Seq] = []
        self._paused = False
        self._frozen = False
        self._closed = False
        self.generated_tokens = 0
        self.steps = 0
        self._seed_source = torch.Generator().manual_seed(int(time.time_ns() % (2**63)))

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        threads: int | None = None,
        model_name: str | None = None,
        dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> InferenceEngine:
        """Load a Hugging Face causal LM and its tokenizer from a local directory."""
        # here, not at the top: transformers takes ~1.5 s to import, and the processes that
        # import this package only to launch an engine (process.py, vllm_server.py) never load a model
        import transformers

        if threads is not None:
            torch.set_num_threads(threads)
        transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        local = Path(path)
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local} is not a Hugging Face model directory (no config.json)")
        tokenizer = transformers.AutoTokenizer.from_pretrained(local)
        model = transformers.AutoModelForCausalLM.from_pretrained(local, dtype=dtype)
        return cls(model, tokenizer, model_name=model_name or local.name, **kwargs)

    # ------------------------------------------------------------------------------ public API
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def num_running(self) -> int:
        return sum(1 for s in self._running if not s.done)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        adapter: str | None = None,
    ) -> AsyncGenerator[RequestUpdate, None]:
        """Stream updates for one request; closing the iterator early cancels the request.

        ``adapter``: the LoRA adapter that serves it (:meth:`load_adapter`); None, or a name not loaded
        (an adapter that has not trained yet: the base is what it would add nothing to), the base."""
        req = self._make_request(prompt_ids, params, request_id)
        req.adapter = adapter
        self._ensure_started()
        self._waiting.append(req)
        self._wake.set()
        async with self._changed:
            self._changed.notify_all()
        try:
            while True:
                item = await req.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if req.unfinished:
                req.cancelled = True
                if self._loop is not None and not self._closed:
                    self._wake.set()

    async def complete(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        adapter: str | None = None,
    ) -> GenerationResult:
        """Run one request to the end."""
        choices: list[ChoiceResult] = []
        rid = request_id or uuid.uuid4().hex
        async for update in self.generate(prompt_ids, params, request_id=rid, adapter=adapter):
            choices.extend(update.finished)
        return GenerationResult(rid, list(prompt_ids), sorted(choices, key=lambda c: c.index))

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop admitting requests; ``abort``/``wait``/``keep`` decide what happens to running ones."""
        if mode not in ("abort", "wait", "keep"):
            raise InvalidRequestError(f"pause mode must be abort, wait or keep, got {mode!r}")
        self._ensure_started()
        self._paused = True
        self._frozen = mode == "keep"  # wait/abort after keep must not wait on frozen sequences
        self._wake.set()
        if mode == "keep":
            async with self._step_lock:  # returns once the step in progress (if any) is over
                pass
        elif mode == "abort":
            async with self._step_lock:
                updates: dict[Request, RequestUpdate] = {}
                for seq in self._running:
                    if not seq.done:
                        self._finish(seq, "abort", None, updates)
                self._dispatch(updates)
        else:
            async with self._changed:
                await self._changed.wait_for(lambda: self.num_running == 0)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; checked whenever a request is queued or a step ends."""
        self._ensure_started()
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def resume(self) -> None:
        self._ensure_started()
        self._paused = False
        self._frozen = False
        self._wake.set()

    async def load_weights(self, source: Mapping[str, torch.Tensor] | str | Path, version: int) -> None:
        """Load new weights between two decoding steps; on any error the old weights keep serving.

        ``source`` is a state dict (tensors are copied; do not mutate them until this returns) or a path
        to a ``save_pretrained`` directory or a single ``.safetensors``/``.bin``/``.pt`` file.
        """
        self._ensure_started()
        loop = asyncio.get_running_loop()
        where = str(source) if isinstance(source, str | Path) else "state dict"
        try:
            tensors = (
                await loop.run_in_executor(None, read_state_dict, source)
                if isinstance(source, str | Path)
                else dict(source)
            )
            plan = await loop.run_in_executor(None, check_state_dict, self.model, tensors)
        except WeightLoadError as exc:
            exc.version, exc.source = version, where
            raise
        except Exception as exc:
            raise WeightLoadError(
                f"cannot load weights from {where}: {exc}", version=version, source=where
            ) from exc
        async with self._step_lock:
            try:
                await loop.run_in_executor(self._executor, apply_state_dict, self.model, plan)
            except Exception as exc:  # copy_ of checked same-shape tensors does not fail in practice
                raise WeightLoadError(
                    f"applying weights failed: {exc}", version=version, source=where
                ) from exc
            self._version = version

    # ------------------------------------------------------------------------------ adapters
    @property
    def adapters(self) -> dict[str, int]:
        """The LoRA adapters served (adapters.py): name → version."""
        return {name: a.version for name, a in self.runner.adapters.items()}

    def adapter_for(self, model: str | None) -> str | None:
        """The adapter a request's ``model`` names: itself when one is loaded under it, else None (base)."""
        return model if model is not None and model in self.runner.adapters else None

    async def load_adapter(
        self,
        name: str,
        source: str | Path | Mapping[str, torch.Tensor],
        version: int,
        *,
        scaling: float = 1.0,
    ) -> Adapter:
        """Serve ``version`` of adapter ``name`` from the next step on; nothing else changes.

        ``source``: a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``),
        or peft's tensors with their ``scaling`` (alpha / r). Read and checked off the engine's thread;
        the swap is one dictionary assignment between two steps: requests of the base and of the other
        adapters never wait for it. On any error the adapter's previous version keeps serving.
        """
        self._ensure_started()
        loop = asyncio.get_running_loop()
        where = str(source) if isinstance(source, str | Path) else "state dict"
        shapes = self.runner.projection_shapes()
        dtype = self.runner.dtype

        def prepare() -> Adapter:
            tensors, scale = (
                read_adapter(source)[:2] if isinstance(source, str | Path) else (dict(source), scaling)
            )
            return check_adapter(name, version, tensors, scale, shapes, dtype)

        try:
            adapter = await loop.run_in_executor(None, prepare)
        except WeightLoadError as exc:
            exc.version, exc.source = version, where
            raise
        except Exception as exc:
            raise WeightLoadError(
                f"cannot load adapter {name} from {where}: {exc}", version=version, source=where
            ) from exc
        async with self._step_lock:
            self.runner.adapters[name] = adapter
        return adapter

    async def unload_adapter(self, name: str) -> bool:
        """Stop serving adapter ``name`` (its requests fall back to the base); False if it was not loaded."""
        self._ensure_started()
        async with self._step_lock:
            return self.runner.adapters.pop(name, None) is not None

    async def close(self) -> None:
        """Fail waiting and running requests, stop the scheduler and the worker thread."""
        self._closed = True
        if self._task is not None and self._loop is asyncio.get_running_loop():
            self._wake.set()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        error = EngineStepError("engine closed")
        for req in list(self._waiting) + list({s.req: None for s in self._running}):
            req.queue.put_nowait(error)
        self._waiting.clear()
        self._running = []
        self._executor.shutdown(wait=True)

    # --------------------------------------------------------------------------- scheduling
    def check_prompt(self, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """Validate a request without running it; returns its effective ``max_tokens``."""
        if self._closed:
            raise EngineStepError("engine closed")
        params.validate(self.runner.vocab_size)
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.runner.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary (size {vocab})")
        room = self.max_model_len - len(prompt_ids)
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if room < 1 or max_tokens > room:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} for the "
                "completion). Please reduce the length of the messages or completion."
            )
        return max_tokens

    def _make_request(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None
    ) -> Request:
        prompt = [int(t) for t in prompt_ids]
        max_tokens = self.check_prompt(prompt, params)
        forced = None
        if self.forced_output is not None and (ids := self.forced_output(prompt)) is not None:
            forced = [int(t) for t in ids]
            if any(not 0 <= t < self.runner.vocab_size for t in forced):
                raise InvalidRequestError("forced_output returned a token id outside the vocabulary")
        return Request(request_id or uuid.uuid4().hex, prompt, params, max_tokens, asyncio.Queue(), forced)

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        if self._closed:
            raise EngineStepError("engine closed")
        # First use, or a new event loop (the old one is gone with its task): start fresh.
        self._loop = loop
        self._waiting.clear()
        self._running = []
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._task = loop.create_task(self._schedule(), name="flywheel-engine")

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._wake.clear()  # cleared before looking, so a request added meanwhile is never missed
            async with self._step_lock:
                self._drop_cancelled()
                admits = self._admissions()
                decode = not self._frozen and any(not s.done for s in self._running)
                if admits or decode:
                    running = list(self._running)
                    try:
                        updates = await loop.run_in_executor(
                            self._executor, self._step, admits, running, decode
                        )
                    except Exception as exc:
                        self._fail_all(admits, EngineStepError(f"model step failed: {exc}"))
                    else:
                        self._dispatch(updates)
            async with self._changed:
                self._changed.notify_all()
            if not admits and not decode:
                if self.num_running == 0:
                    self._running = []
                    self.runner.release()  # idle: give the KV cache's memory back
                await self._wake.wait()

    def _admissions(self) -> list[Request]:
        if self._paused:
            return []
        live = self.num_running
        admits: list[Request] = []
        while self._waiting:
            req = self._waiting[0]
            if live and live + req.params.n > self.max_num_seqs:
                break
            self._waiting.popleft()
            admits.append(req)
            live += req.params.n
        return admits

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self._waiting):
            self._waiting = deque(r for r in self._waiting if not r.cancelled)
        for seq in self._running:
            if seq.req.cancelled and not seq.done:
                seq.done = True
                seq.req.unfinished -= 1

    def _fail_all(self, admits: list[Request], error: BaseException) -> None:
        reqs = {s.req: None for s in self._running} | dict.fromkeys(admits)
        for req in reqs:
            req.unfinished = 0
            req.queue.put_nowait(error)
        self._running = []
        self.runner.release()

    def _dispatch(self, updates: dict[Request, RequestUpdate]) -> None:
        for req, update in updates.items():
            req.queue.put_nowait(update)
            if req.unfinished == 0:
                req.queue.put_nowait(None)
