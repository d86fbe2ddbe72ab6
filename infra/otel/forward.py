"""The OpenTelemetry export of a process whose bus is its own (``flywheel gateway`` on the in-process bus),
with the export work in a child process.

On the in-process bus the ``otel-export`` consumer must live in the gateway's process, but building spans,
the OpenTelemetry SDK and its protobuf encoding cost ~0.15 ms of CPU a call, taken from the gateway under
its GIL. :class:`ExportForwarder` is that consumer reduced to the cheap part: each batch of events it
reads (every ``flush_interval_s`` at most) is serialised (``schemas.encode``, a few µs an event) and
written as length-prefixed frames to the stdin of ``python -m infra.otel.child``, which decodes them and
runs the same :class:`infra.otel.exporter.OtelExporter` (span building, ``BatchSpanProcessor``, OTLP/HTTP).

Never blocking the gateway: the pipe's buffer in this process is bounded (``max_buffer_bytes``); a batch
that does not fit, because the child falls behind, is dropped and counted
(``flywheel_otel_forward_dropped_events`` on the gateway's registry, and a warning log). When the child
dies, its exit is logged and export stops (later events are dropped and counted); the gateway keeps
serving. ``stop`` closes the child's stdin and waits for it to send what it has (``stop_timeout_s``).

Frame: 4-byte big-endian length of what follows, then one byte (0: ``flywheel.episodes``, 1:
``flywheel.transitions``) and the event's JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from infra.otel.exporter import EXPORT_GROUP
from infra.otel.settings import OtelSettings
from schemas import EPISODES, TRANSITIONS, encode

log = get_logger(__name__)

TOPICS = (EPISODES, TRANSITIONS)  # a frame's topic byte indexes this
HEADER = struct.Struct(">I")
CHILD_SETTINGS = {
    "otlp_endpoint",
    "otlp_capture_content",
    "otlp_service_name",
    "otlp_score_wait_s",
    "otlp_max_queue",
}  # what the child is told (its argument); OTEL_EXPORTER_OTLP_* it inherits with the environment
MAX_FRAME = 64 * 1024 * 1024  # an event larger than this is not a frame (the child refuses it)


@dataclass
class ForwardStats:
    events: int = 0  # written to the child's stdin
    dropped: int = 0  # not written: the buffer was full or the child had exited
    child_exit: int | None = None  # the child's exit status once it has exited


class ExportForwarder:
    """Consumes episodes and scores as ``group`` and hands their bytes to the export child."""

    def __init__(
        self,
        bus: Bus,
        settings: OtelSettings,
        *,
        group: str = EXPORT_GROUP,
        flush_interval_s: float = 0.05,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        stop_timeout_s: float = 30.0,
        registry: CollectorRegistry | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.group = group
        self.stats = ForwardStats()
        self._flush_interval_s = flush_interval_s
        self._max_buffer_bytes = max_buffer_bytes
        self._stop_timeout_s = stop_timeout_s
        self._command = list(command or [sys.executable, "-m", "infra.otel.child"])
        self._dropped = Counter(
            "flywheel_otel_forward_dropped_events",
            "events not handed to the OpenTelemetry export child (its buffer full, or it had exited)",
            registry=registry,
        )
        self._proc: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._subs: list[Subscription] = []
        self._stopping = False
        self._warned_full = False

    @property
    def child_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        await self.bus.ensure_topics(list(TOPICS))
        self._proc = await asyncio.create_subprocess_exec(
            *self._command,
            self.settings.model_dump_json(include=CHILD_SETTINGS),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
        )
        self._watcher = asyncio.create_task(self._watch(self._proc), name="otel-export-child")
        for index, topic in enumerate(TOPICS):  # a new group starts at the end, as the exporter's does
            sub = await self.bus.subscribe_batch(
                topic,
                self.group,
                functools.partial(self._handle, index),
                max_batch=1000,
                max_wait_s=self._flush_interval_s,
                from_beginning=False,
            )
            self._subs.append(sub)
        log.info("otel_export.forwarding", group=self.group, child=self._proc.pid)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        self.stats.child_exit = rc
        if not self._stopping:
            log.error("otel_export.child_died", returncode=rc, exported="stopped; events are dropped")

    async def _handle(self, index: int, messages: Sequence[Message]) -> None:
        proc = self._proc
        stdin = proc.stdin if proc is not None else None
        if stdin is None or proc is None or proc.returncode is not None or stdin.is_closing():
            self._drop(len(messages), "child_exited")
            return
        if stdin.transport.get_write_buffer_size() > self._max_buffer_bytes:
            self._drop(len(messages), "buffer_full")
            return
        self._warned_full = False
        parts: list[bytes] = []
        tag = bytes((index,))
        for message in messages:
            data = encode(message.event)
            parts.append(HEADER.pack(len(data) + 1))
            parts.append(tag)
            parts.append(data)
        try:
            stdin.write(b"".join(parts))
        except (ConnectionError, RuntimeError):  # the child exited between the check and the write
            self._drop(len(messages), "child_exited")
            return
        self.stats.events += len(messages)

    def _drop(self, n: int, why: str) -> None:
        self.stats.dropped += n
        self._dropped.inc(n)
        if why == "buffer_full" and not self._warned_full:  # once per run of full batches
            self._warned_full = True
            log.warning("otel_export.dropped", reason=why, events=n, dropped_total=self.stats.dropped)

    async def stop(self) -> None:
        """Stop consuming, close the child's stdin and wait for it to export what it has."""
        self._stopping = True
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()
        proc = self._proc
        if proc is None:
            return
        deadline = asyncio.get_running_loop().time() + self._stop_timeout_s
        if proc.stdin is not None and proc.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                proc.stdin.write_eof()  # the child reads the rest, flushes its spans, exits
                await asyncio.wait_for(proc.stdin.drain(), self._stop_timeout_s)
        try:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            await asyncio.wait_for(asyncio.shield(proc.wait()), left)
        except TimeoutError:
            log.warning("otel_export.child_killed", after_s=self._stop_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._watcher is not None:
            await self._watcher
        log.info(
            "otel_export.stopped",
            forwarded=self.stats.events,
            dropped=self.stats.dropped,
            child_exit=self.stats.child_exit,
        )
