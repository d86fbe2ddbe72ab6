"""A user scorer for the distributed-run test: alternates 0/1 per task so every GRPO group has variance.

Referenced as ``tests.e2e.ops_scorers:alternating`` by the reward service process (PYTHONPATH = repo).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

_seen: Counter[str] = Counter()


def alternating(episode: dict[str, Any]) -> float:
    task = (episode.get("task") or {}).get("task_id", "")
    _seen[task] += 1
    return float(_seen[task] % 2)
