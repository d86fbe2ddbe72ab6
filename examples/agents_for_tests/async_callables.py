"""Callable agents for worker tests that need no model: instant, slow, failing and sync variants."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def instant(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    return {"output": {"echo": task.get("input"), "base_url": llm.base_url}, "reward": 1.0}


async def sleepy(task: dict[str, Any], llm: Any) -> str:
    await asyncio.sleep(float((task.get("input") or {}).get("sleep", 3600)))
    return "woke up"


async def broken(task: dict[str, Any], llm: Any) -> None:
    raise ValueError("this agent always fails")


def sync_instant(task: dict[str, Any], llm: Any) -> float:
    time.sleep(0.01)
    return 0.5
