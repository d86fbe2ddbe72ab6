"""Identifier rules (DESIGN.md, "Identifiers").

Episode ids are the capability that lets an agent write into an episode, so they carry 122 random
bits (UUID4). Event ids are UUIDv7-shaped: time-ordered for ClickHouse locality, random for
uniqueness; they are what every consumer deduplicates on.
"""

from __future__ import annotations

import os
import re
import time
import uuid

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def new_episode_id() -> str:
    """A fresh, unguessable episode id (32 lowercase hex characters)."""
    return uuid.uuid4().hex


def new_event_id() -> str:
    """A fresh event id: 48-bit millisecond timestamp + 74 random bits, UUIDv7 layout, hex form."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a (12 bits)
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b (62 bits)
    return uuid.UUID(int=value).hex


def new_group_id() -> str:
    return uuid.uuid4().hex


def is_valid_episode_id(value: str) -> bool:
    """True when ``value`` has the shape of an id minted by :func:`new_episode_id`."""
    return bool(_HEX32.match(value))
