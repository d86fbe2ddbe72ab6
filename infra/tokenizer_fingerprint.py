"""A tokenizer's fingerprint: which tokenizer made a recorded sequence of token ids.

Token ids mean something only to the tokenizer that made them. The gateway records this fingerprint with
every call (``LLMCallRecorded.tokenizer``), the reward service carries it into each ``Transition``, and
``flywheel replay --tokenizer`` refuses to replay recorded ids into a model whose tokenizer has another
(docs/replay.md, "Replay into a new model").

The fingerprint is the first 16 hex digits of the SHA-256 of the id → token table, the added (special)
tokens and the special-token roles: two tokenizers that map every id to the same token, with the same
specials, share it, whatever their file format (fast or slow, ``tokenizer.json`` or vocab files).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

LENGTH = 16


def fingerprint(tokenizer: Any) -> str:
    """The fingerprint of a Hugging Face tokenizer object (``get_vocab``, ``added_tokens_decoder``)."""
    vocab = sorted((int(i), str(t)) for t, i in tokenizer.get_vocab().items())
    added = sorted((int(i), str(tok)) for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items())
    roles = sorted(
        (str(k), str(v)) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
    )
    blob = json.dumps([vocab, added, roles], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:LENGTH]


@lru_cache(maxsize=8)
def fingerprint_of(model_dir: Path) -> str:
    """The fingerprint of the tokenizer saved in ``model_dir`` (a Hugging Face model directory)."""
    from transformers import AutoTokenizer  # the CLI's and the stack's environment; services need none

    return fingerprint(AutoTokenizer.from_pretrained(str(model_dir)))


def is_fingerprint(text: str) -> bool:
    return len(text) == LENGTH and all(c in "0123456789abcdef" for c in text)
