"""The embedded inference engine: continuous batching, exact logprobs, weight versions, vLLM's HTTP API.

``InferenceEngine`` (core.py) serves a Hugging Face causal LM in-process; ``create_engine_app``
(app.py) puts the vLLM-compatible OpenAI API in front of it.
"""

from infra.engine.core import (
    ChoiceResult,
    EngineStepError,
    GenerationResult,
    InferenceEngine,
    PauseMode,
    RequestUpdate,
    TokenEvent,
)
from infra.engine.runner import UnsupportedModelError
from infra.engine.sampling import InvalidRequestError, SamplingParams
from infra.engine.weight_loading import WeightLoadError

__all__ = [
    "ChoiceResult",
    "EngineStepError",
    "GenerationResult",
    "InferenceEngine",
    "InvalidRequestError",
    "PauseMode",
    "RequestUpdate",
    "SamplingParams",
    "TokenEvent",
    "UnsupportedModelError",
    "WeightLoadError",
]
