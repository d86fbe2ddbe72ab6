"""What the OpenTelemetry export costs the gateway's own process when its spans are built in a child.

    python tests/benchmarks/otel_forward.py [--events 20000]

On the in-process bus the export's consumer is ``infra.otel.forward.ExportForwarder``: it serialises each
event and writes it to the stdin of the export child (``infra.otel.child``). This measures what that costs
the publishing process: ``--events`` call events (``tests/unit/test_otel_export.py``'s ``call``) are
published on a ``MemoryBus`` once without a consumer and once with the forwarder, twice each; the
difference in this process's CPU time per event is the figure. The child here only drains its stdin
(``cat``): its own work (span building, the SDK, OTLP) is in another process and is measured by
``tests/benchmarks/otel_export.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from infra.bus.memory import MemoryBus
from infra.otel.forward import ExportForwarder
from infra.otel.settings import OtelSettings
from schemas import EPISODES
from schemas.ids import new_episode_id
from tests.unit.test_otel_export import call


async def _publish(n: int, forward: bool) -> float:
    """CPU seconds this process spent publishing ``n`` call events (and forwarding them when asked)."""
    async with MemoryBus() as bus:
        forwarder = None
        if forward:
            settings = OtelSettings(otlp_endpoint="http://127.0.0.1:9")
            forwarder = ExportForwarder(bus, settings, command=["sh", "-c", "cat > /dev/null", "child"])
            await forwarder.start()
        else:
            await bus.ensure_topics([EPISODES])
        events = [call(new_episode_id(), 0) for _ in range(n)]
        start = time.process_time()
        for i, event in enumerate(events):
            await bus.publish(EPISODES, event, key=event.episode_id)
            if i % 100 == 0:
                await asyncio.sleep(0.001)  # let the consumer run, as between a gateway's calls
        await asyncio.sleep(0.3)
        for _ in range(1000):  # the last batches: read within the forwarder's batch wait
            if forwarder is None or forwarder.stats.events + forwarder.stats.dropped >= n:
                break
            await asyncio.sleep(0.01)
        used = time.process_time() - start
        if forwarder is not None:
            await forwarder.stop()
            assert forwarder.stats.dropped == 0
        return used


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    n = parser.parse_args().events
    off = [await _publish(n, False), await _publish(n, False)]
    on = [await _publish(n, True), await _publish(n, True)]
    per_event_ms = (sum(on) - sum(off)) / len(on) / n * 1000
    print(f"without the forwarder {off} s, with it {on} s: {per_event_ms:.4f} ms of CPU an event")


if __name__ == "__main__":
    asyncio.run(main())
