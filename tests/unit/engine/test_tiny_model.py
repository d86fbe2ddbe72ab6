from __future__ import annotations

import time

import pytest

from trainer.models.tiny import build_model, build_tiny, build_tokenizer

CORPUS = [f"CALC: {a}+{b} = {a + b}" for a in range(30) for b in range(30)]


def test_tokenizer_splits_digits_and_round_trips() -> None:
    tok = build_tokenizer(CORPUS, 300)
    ids = tok.encode("CALC: 47+38 = 85 — héllo")
    assert tok.decode(ids) == "CALC: 47+38 = 85 — héllo"
    pieces = tok.convert_ids_to_tokens(tok.encode("1234"))
    assert pieces == ["1", "2", "3", "4"]
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok.encode(special)) == 1
    assert tok.pad_token == "<|pad|>"
    assert tok.eos_token == "<|im_end|>"


def test_chat_template_renders_roles_tools_and_generation_prompt() -> None:
    tok = build_tokenizer(CORPUS, 300)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+3"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "calc"' in text
    assert "<|im_start|>user\n2+3?<|im_end|>\n" in text
    assert '<tool_call>\n{"name": "calc", "arguments": {"e": "2+3"}}\n</tool_call><|im_end|>\n' in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=False)
    assert plain == "<|im_start|>user\n2+3?<|im_end|>\n"


def test_demo_sized_model_has_3_to_5_million_parameters() -> None:
    tok = build_tokenizer(CORPUS, 512)
    model = build_model(tok, hidden=256, layers=4, heads=4, kv_heads=2, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert 3_000_000 <= n <= 5_000_000
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_build_tiny_saves_and_reuses_the_cache(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny(tmp_path / "m", CORPUS, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1)
    stamp = (out / "config.json").stat().st_mtime_ns
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert tok.convert_ids_to_tokens(tok.encode("12")) == ["1", "2"]
    assert model.config.hidden_size == 32
    time.sleep(0.01)  # mtime granularity: a rebuild would now change the stamp
    assert build_tiny(tmp_path / "m", CORPUS, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1) == out
    assert (out / "config.json").stat().st_mtime_ns == stamp
    build_tiny(tmp_path / "m", CORPUS, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, seed=1)
    assert (out / "config.json").stat().st_mtime_ns != stamp


def test_bad_sizes_are_refused() -> None:
    tok = build_tokenizer(CORPUS, 300)
    with pytest.raises(ValueError, match="divide"):
        build_model(tok, hidden=250, heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(CORPUS, 100)


def test_reloaded_tokenizer_encodes_exactly_like_the_built_one(tmp_path) -> None:
    from transformers import AutoTokenizer

    from trainer.models.tiny import build_tokenizer as build

    out = build_tiny(tmp_path / "m", CORPUS, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1)
    built, loaded = build(CORPUS, 300), AutoTokenizer.from_pretrained(out)
    texts = [
        "$hello 12+30",
        "I'LL don't\r\n\r\n  x",
        "Cafe\u0301 ﬁ 😀",
        "<|im_start|>user\nhi<|im_end|>\n",
        "  a\tb  ",
    ]
    for text in texts:
        assert built.encode(text) == loaded.encode(text), text
    msgs = [{"role": "user", "content": "What is 4+5?"}]
    assert built.apply_chat_template(
        msgs, add_generation_prompt=True, return_dict=False
    ) == loaded.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
