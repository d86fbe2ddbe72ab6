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
from infra.bus.factory import make_bus

__all__ = [
    "BatchHandler",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusUnavailableError",
    "Handler",
    "Message",
    "Subscription",
    "make_bus",
]
