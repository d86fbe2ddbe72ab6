"""Two channels: production calls at the served version, training rollouts at the trainer's latest.

With releases on (``FLYWHEEL_RELEASES=gated``) the gateway keeps the release book
(``infra/releases.py``, folded from ``flywheel.control`` and saved under its data dir) and routes:

- a **production call** (a tenant key's session) to the version its policy's release serves, or, while
  a canary runs, a session among the canary's share (by a hash of its id: every call of the session) to
  the canary's version;
- a call of an episode whose model names a version (``policy@v12``, ``terse@v3``: a gate's evaluation
  rollouts, a canary) to that version;
- every other call (training rollouts) as before, to the trainer's latest weights.

Whole-model versions are served by **slots**: engines of their own (the embedded stack starts them in
process; elsewhere ``FLYWHEEL_RELEASE_SLOT_URLS`` names ``flywheel engine`` servers, each loading one
version's weights over ``POST /load_weights``, or with ``FLYWHEEL_RELEASE_SLOT_KIND=vllm`` vLLM servers
of their own, reloaded in place from the version's directory through vLLM's dev routes,
``infra/vllm/reload.py``). The first slot serves production; the
second, when given, serves the versions named by evaluation rollouts. A slot drains its calls before it
loads (its own :class:`Admission`), so every call is answered by, and recorded with, one version.
A LoRA adapter's versions need no slot: each is loaded into the policy's engine under its own name
(``terse@v3``; ``POST /load_adapter`` on the embedded engine, ``/v1/load_lora_adapter`` on vLLM) and asked
for by that name; version 0 is the base.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from gateway.control import Admission
from gateway.episodes.registry import EpisodeState
from gateway.errors import GatewayError
from gateway.settings import GatewaySettings
from gateway.upstream.client import Upstream, UpstreamPool, make_upstream
from infra.logging import get_logger
from infra.releases import ReleaseBook, parse_versioned, versioned_name
from infra.vllm.reload import VllmReloader, VllmReloadError
from schemas import EpisodeSource, UpstreamKind
from schemas.control import ReleaseEvent

log = get_logger("gateway.releases")


class VersionUnavailableError(GatewayError):
    """A call names a version this gateway cannot serve (unknown, or its weights failed to load)."""

    def __init__(self, message: str, *, status_code: int = 404) -> None:
        kind = "not_found_error" if status_code == 404 else "service_unavailable"
        super().__init__(message, status_code=status_code, error_type=kind, code="version_unavailable")


class SlotLoadError(RuntimeError):
    pass


@dataclass(slots=True)
class Routed:
    """Where one call goes: ``upstream``/``admission`` None keep the default; ``model`` is the name to ask."""

    adapter: str | None
    upstream: Upstream | None = None
    admission: Admission | None = None
    model: str | None = None
    adapter_version: int | None = None


class Slot:
    """An engine that serves one whole-model version at a time; loading drains its calls first."""

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        *,
        admin_token: str,
        hold_s: float,
        drain_s: float,
        kind: Literal["engine", "vllm"] = "engine",
    ) -> None:
        self.name = name
        self.upstream = upstream
        self.kind = kind
        self.admission = Admission(weight_version=0, hold_s=hold_s)
        self.admin_token = admin_token
        self.drain_s = drain_s
        self._lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self.admission.weight_version

    async def load(self, version: int, path: str) -> None:
        """Serve ``version`` (weights at ``path``) from the next call; on failure the old one keeps serving."""
        async with self._lock:
            if self.version == version:
                return
            await self.admission.pause(version, self.drain_s)
            loaded = self.version
            try:
                if self.kind == "vllm":
                    await self._reload_vllm(version, path)
                else:
                    await _post(
                        self.upstream, "/load_weights", {"path": path, "version": version}, self.admin_token
                    )
                loaded = version
            finally:
                self.admission.resume(loaded)
            log.info("slot loaded", slot=self.name, version=version, path=path)

    async def _reload_vllm(self, version: int, path: str) -> None:
        """vLLM's dev-mode reload (``infra/vllm/reload.py``): the directory of ``path``'s safetensors."""
        root = str(self.upstream.client.base_url)
        reloader = VllmReloader(root, self.upstream.client, token=self.admin_token or None)
        try:
            await reloader.reload(Path(path), str(version))
        except VllmReloadError as exc:
            raise SlotLoadError(f"{self.upstream.url}: {exc}") from exc


class ReleaseRouter:
    """The gateway's side of releases: the book, the slots, and where each call goes."""

    def __init__(
        self,
        book: ReleaseBook,
        *,
        slots: Sequence[Slot] = (),
        base_path: str | None = None,
        admin_token: str = "",
    ) -> None:
        self.book = book
        self.slots = list(slots)
        self.base_path = base_path  # the starting weights (version 0) a slot reloads on a rollback to 0
        self.admin_token = admin_token
        self._adapters_loaded: set[tuple[str, str]] = set()  # (upstream URL, adapter@vN)
        self._adapter_locks: dict[str, asyncio.Lock] = {}
        self.owned: list[Upstream] = []  # slot upstreams made from FLYWHEEL_RELEASE_SLOT_URLS: closed here

    async def aclose(self) -> None:
        """Close the connections of the slots this router made (a host's own slots are the host's)."""
        owned, self.owned = self.owned, []
        if owned:
            await UpstreamPool(owned).aclose()

    @property
    def served_slot(self) -> Slot | None:
        return self.slots[0] if self.slots else None

    @property
    def eval_slot(self) -> Slot | None:
        return self.slots[1] if len(self.slots) > 1 else self.served_slot

    # ------------------------------------------------------------------ the book
    async def apply(self, event: ReleaseEvent) -> bool:
        """Fold ``event`` and, when the served version changed, load it before the next production call."""
        if not self.book.apply(event):
            return False
        await self.prepare(event.adapter)
        return True

    async def prepare(self, adapter: str | None) -> None:
        """Make the served version of ``adapter``'s policy loadable now (a slot load; adapters load lazily)."""
        slot = self.served_slot
        if adapter is not None or slot is None:
            return
        served = self.book.served(None)
        if slot.version == served:
            return
        try:
            await slot.load(served, self._path(None, served))
        except (SlotLoadError, VersionUnavailableError) as exc:
            log.error("served version not loaded: the slot keeps its version", version=served, error=str(exc))

    def _path(self, adapter: str | None, version: int) -> str:
        if version == 0 and adapter is None:
            if self.base_path is None:
                raise VersionUnavailableError("version 0 (the starting weights) has no path on this gateway")
            return self.base_path
        path = self.book.release(adapter).checkpoint(version)
        if path is None:
            name = adapter or self.book.model
            raise VersionUnavailableError(f"{name}: version {version} is unknown to this gateway")
        return path

    # ------------------------------------------------------------------ routing
    async def route(self, episode: EpisodeState, adapter: str | None, upstream: Upstream) -> Routed | None:
        """Where a call of ``episode`` goes (``adapter``: its policy); None: the latest, as without releases."""
        named = parse_versioned(episode.model)
        if named is not None:
            name, version = named
            adapter = None if name == self.book.model else name
            return await self._version(adapter, version, upstream, production=False)
        if episode.source is EpisodeSource.production:
            rel = self.book.release(adapter)
            if rel.canary is not None and in_canary(
                episode.session_id or episode.episode_id, rel.canary["share"]
            ):
                return await self._version(adapter, int(rel.canary["version"]), upstream, production=False)
            return await self._version(adapter, rel.served, upstream, production=True)
        return None

    async def _version(
        self, adapter: str | None, version: int, upstream: Upstream, *, production: bool
    ) -> Routed:
        if adapter is not None:
            if version == 0:  # the base: vLLM's base model; the embedded engine serves an unknown name by it
                base = await self._base_name(upstream) or versioned_name(adapter, 0)
                return Routed(adapter, model=base, adapter_version=0)
            name = versioned_name(adapter, version)
            await self._load_adapter(upstream, name, self._path(adapter, version), version)
            return Routed(adapter, model=name, adapter_version=version)
        slot = self.served_slot if production or version == self.book.served(None) else self.eval_slot
        if slot is None and version == 0 and production:
            return Routed(None)  # no slots: LoRA policies over a frozen base, which is version 0
        if slot is None:
            raise VersionUnavailableError(
                "this gateway has no slot to serve a fixed version", status_code=503
            )
        if slot.version != version and not production:
            try:
                await slot.load(version, self._path(None, version))
            except SlotLoadError as exc:
                raise VersionUnavailableError(str(exc), status_code=503) from exc
        return Routed(None, upstream=slot.upstream, admission=slot.admission)

    async def _base_name(self, upstream: Upstream) -> str | None:
        return await upstream.base_model() if upstream.kind is UpstreamKind.vllm else None

    async def _load_adapter(self, upstream: Upstream, name: str, path: str, version: int) -> None:
        key = (upstream.url, name)
        if key in self._adapters_loaded:
            return
        async with self._adapter_locks.setdefault(name, asyncio.Lock()):
            if key in self._adapters_loaded:
                return
            if not await asyncio.to_thread(Path(path).exists):
                raise VersionUnavailableError(f"{name}: its weights ({path}) are not on this gateway's disk")
            try:
                if upstream.kind is UpstreamKind.vllm:
                    await _post(upstream, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, "")
                else:
                    body = {"name": name, "path": path, "version": version}
                    await _post(upstream, "/load_adapter", body, self.admin_token)
            except SlotLoadError as exc:
                raise VersionUnavailableError(str(exc), status_code=503) from exc
            self._adapters_loaded.add(key)
            log.info("adapter version loaded", adapter=name, upstream=upstream.url)


def in_canary(session: str, share: float) -> bool:
    """Whether ``session`` is among the ``share`` of sessions a canary gets: the same answer every call."""
    return zlib.crc32(session.encode()) / 2**32 < share


async def _post(upstream: Upstream, route: str, body: dict[str, object], token: str) -> None:
    root = str(upstream.client.base_url).rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = await upstream.client.post(root + route, json=body, headers=headers, timeout=300.0)
    except httpx.HTTPError as exc:
        raise SlotLoadError(f"{upstream.url}{route}: {type(exc).__name__}") from exc
    if r.status_code != 200:
        raise SlotLoadError(f"{upstream.url}{route} answered {r.status_code}: {r.text[:300]}")


def build_release_router(settings: GatewaySettings, slots: Sequence[Upstream] = ()) -> ReleaseRouter | None:
    """With ``releases=gated``: the book (saved under the data dir) and the slots that serve versions."""
    if settings.releases == "off":
        return None
    if not slots and not settings.release_slot_urls and not settings.policies:
        raise ValueError(
            "releases=gated serves whole-model versions from slots: set FLYWHEEL_RELEASE_SLOT_URLS "
            "(or FLYWHEEL_POLICIES: LoRA adapters over a frozen base need none)"
        )
    token = settings.admin_token.get_secret_value()
    owned: list[Upstream] = []
    if not slots and settings.release_slot_urls:
        kind = UpstreamKind.vllm if settings.release_slot_kind == "vllm" else UpstreamKind.embedded
        slots = owned = [
            make_upstream(url.strip(), kind=kind, timeout_s=settings.upstream_timeout_s)
            for url in settings.release_slot_urls.split(",")
            if url.strip()
        ]
    router = ReleaseRouter(
        ReleaseBook(settings.model, settings.data_dir / "gateway" / "releases.json"),
        slots=[
            Slot(
                "served" if i == 0 else "evaluation",
                up,
                admin_token=token,
                hold_s=settings.pause_hold_s,
                drain_s=settings.pause_drain_timeout_s,
                kind=settings.release_slot_kind if settings.release_slot_urls else "engine",
            )
            for i, up in enumerate(slots)
        ],
        base_path=settings.release_base_path or None,
        admin_token=token,
    )
    router.owned = owned
    return router
