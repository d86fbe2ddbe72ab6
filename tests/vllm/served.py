"""The shared live vLLM's served weights, put back after a test that trained the whole model into it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from trainer.vllm_sink import VllmSink
from trainer.weights import WeightUpdate


def restore_base_weights(url: str, model_dir: Path) -> None:
    """Reload ``model_dir`` (the model the server started with) as version 0, for the tests that follow."""

    async def load() -> None:
        sink = VllmSink(url)
        try:
            await sink.load(WeightUpdate(version=0, state_dict=dict, path=model_dir))
        finally:
            await sink.aclose()

    asyncio.run(load())
