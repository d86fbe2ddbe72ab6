"""``python -m infra.otel.child SETTINGS_JSON``: the export work of :class:`infra.otel.forward.ExportForwarder`.

Reads the frames the forwarder writes to its stdin (``infra.otel.forward``: length, topic byte, the
event's JSON), decodes each event and hands it to an :class:`infra.otel.exporter.OtelExporter` built
from ``SETTINGS_JSON`` (``FLYWHEEL_OTLP_*`` as JSON), which builds the spans and sends them over
OTLP/HTTP on the SDK's thread. At the end of its stdin (the gateway stopping, or dying) it sends the
episodes still waiting for a score, flushes and exits 0. It ignores SIGINT: the gateway's terminal's
Ctrl-C is the gateway's to handle; this process ends when its stdin does. It runs at a lower priority
than the gateway (``NICENESS``): where the two compete for cores, the gateway's calls go first.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from infra.bus.memory import MemoryBus
from infra.logging import configure_logging, get_logger
from infra.otel.app import build
from infra.otel.forward import HEADER, MAX_FRAME, TOPICS
from infra.otel.settings import OtelSettings
from schemas import EventDecodeError, decode

log = get_logger(__name__)

NICENESS = 10  # added to the gateway's: the export yields the CPU to it


async def run(settings: OtelSettings) -> int:
    exporter = build(settings, MemoryBus())  # its bus is unused: events come from stdin
    if exporter is None:
        log.error("otel_export.child_no_endpoint")
        return 2
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    exporter.start_sweeping()
    bad = 0
    try:
        while True:
            try:
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                if not 1 <= size <= MAX_FRAME:
                    log.error("otel_export.child_bad_frame", size=size)
                    return 1
                frame = await reader.readexactly(size)
            except asyncio.IncompleteReadError:
                break  # end of stdin
            try:
                event = decode(TOPICS[frame[0]], frame[1:])
            except (EventDecodeError, IndexError) as exc:
                bad += 1
                log.warning("otel_export.child_bad_event", error=str(exc)[:200], bad=bad)
                continue
            exporter.consume([event])
    finally:
        await exporter.stop()
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # background work: on cores the gateway saturates, the gateway goes first and this catches up after
    # (the forwarder's bounded buffer takes the lag; past it, events are dropped and counted)
    os.nice(NICENESS)
    settings = OtelSettings(**json.loads(argv[1])) if len(argv) > 1 else OtelSettings()
    configure_logging(settings.log_level, settings.log_json)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
