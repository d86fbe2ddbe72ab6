"""Key → partition, the same way Kafka's default partitioner does it (murmur2, positive, modulo).

Both buses use it, so an event lands in the same partition number on the in-process bus and on a
real broker. Keys repeat a lot (every call of an episode shares its ``episode_id``), so results are cached.
"""

from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2


@lru_cache(maxsize=65536)
def partition_for(key: str, partitions: int) -> int:
    if partitions <= 1:
        return 0
    h: int = murmur2(key.encode())
    return (h & 0x7FFFFFFF) % partitions
