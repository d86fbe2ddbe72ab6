"""A tiny Qwen2-style causal LM and byte-level BPE tokenizer, built locally in seconds.

There is no model hub here: the tokenizer is trained on the caller's corpus with ``tokenizers``
(byte-level BPE, every digit its own token so arithmetic is learnable), wrapped in a
``PreTrainedTokenizerFast`` with a Qwen-style ChatML template; the model is a randomly initialised
``Qwen2ForCausalLM`` with tied embeddings (hidden 256 and 4 layers give ~3–5 M parameters with a
small vocabulary). ``build_tiny`` saves both with ``save_pretrained`` so anything that loads a
Hugging Face checkpoint from a path (the embedded engine, the trainer) can use the result, and skips
the work when the directory already holds a build of the same configuration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trainer.models.chat_template import CHAT_TEMPLATE

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)
BUILD_INFO_FILE = "flywheel_tiny.json"
QWEN_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    *,
    min_frequency: int = 2,
    extra_special_tokens: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
    model_max_length: int = 2048,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` (digits split one per token) and wrap it for transformers.

    The vocabulary always holds the 256 byte symbols and the special tokens, so any text encodes;
    ``vocab_size`` is an upper bound (a small corpus may yield fewer merges).
    """
    specials = [*SPECIAL_TOKENS, *(t for t in extra_special_tokens if t not in SPECIAL_TOKENS)]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(f"vocab_size must be at least {len(alphabet) + len(specials)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # transformers loads any qwen2 checkpoint's tokenizer as Qwen2Tokenizer, which installs Qwen's own
    # normalizer and pre-tokenizer (its regex also puts every digit in its own piece). Use exactly that
    # pipeline here too, so the tokenizer returned now and the one reloaded from disk encode alike.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[t for t in specials if t not in (IM_END, PAD)],
        chat_template=chat_template,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    *,
    intermediate: int | None = None,
    max_positions: int = 2048,
    rope_theta: float = 10000.0,
) -> Qwen2ForCausalLM:
    """A randomly initialised ``Qwen2ForCausalLM`` sized for the CPU (fp32, tied embeddings)."""
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})"
        )
    eos_ids = [
        i for i in (tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT))
    ]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.float().eval()  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def _config_hash(corpus: Sequence[str], settings: dict[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for text in corpus:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def build_tiny(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    vocab_size: int = 512,
    hidden: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    intermediate: int | None = None,
    max_positions: int = 2048,
    extra_special_tokens: Sequence[str] = (),
) -> Path:
    """Build tokenizer + model into ``out_dir`` (``save_pretrained``); reuse it if already built alike.

    The cache key hashes the corpus and every size/seed argument, stored in ``flywheel_tiny.json``;
    a directory with a different key is rebuilt in place.
    """
    out = Path(out_dir)
    texts = list(corpus)
    settings: dict[str, object] = {
        "vocab_size": vocab_size,
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "seed": seed,
        "intermediate": intermediate,
        "max_positions": max_positions,
        "extra_special_tokens": list(extra_special_tokens),
        "format": 1,
    }
    key = _config_hash(texts, settings)
    info_path = out / BUILD_INFO_FILE
    if info_path.is_file() and (out / "config.json").is_file():
        try:
            if json.loads(info_path.read_text()).get("config_hash") == key:
                return out
        except (OSError, json.JSONDecodeError):
            pass  # a damaged marker means a rebuild, not a crash
    tokenizer = build_tokenizer(texts, vocab_size, extra_special_tokens=extra_special_tokens)
    model = build_model(
        tokenizer,
        hidden,
        layers,
        heads,
        kv_heads,
        seed,
        intermediate=intermediate,
        max_positions=max_positions,
    )
    out.mkdir(parents=True, exist_ok=True)
    info_path.unlink(missing_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    info_path.write_text(
        json.dumps({"config_hash": key, "settings": settings, "parameters": n_params}, indent=2)
    )
    return out
