"""The event bus interface and its implementations."""

from infra.bus.base import (
    BatchHandler,
    Bus,
    BusClosedError,
    BusError,
    BusUnavailableError,
    Handler,
    Message,
    Subscription,
)

__all__ = [
    "BatchHandler",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusUnavailableError",
    "Handler",
    "Message",
    "Subscription",
]
