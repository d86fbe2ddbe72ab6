"""User scorer functions referenced by tests as ``tests.unit.reward.user_scorers:...``."""

from __future__ import annotations

from typing import Any


def length_score(episode: dict[str, Any]) -> float:
    return float(len(episode["calls"])) + (1.0 if episode["last_message"] == "done" else 0.0)


async def async_score(episode: dict[str, Any]) -> float:
    return 0.25


def explodes(episode: dict[str, Any]) -> float:
    raise RuntimeError("scorer bug")


def not_a_number(episode: dict[str, Any]) -> str:
    return "high"


async def slow(episode: dict[str, Any]) -> float:
    import asyncio

    await asyncio.sleep(30)
    return 1.0
