"""The vLLM options ``flywheel vllm serve`` and ``flywheel up --engine vllm`` share: the context length and
the tool parser (see infra/engine/vllm_server.py, which puts them on vLLM's command line).

The tool parser's name is checked for its shape only: the names vLLM knows live in vLLM's own environment
(and a ``--tool-parser-plugin`` adds more), which the CLI does not import. vLLM checks the name before it
loads the model and exits with ``invalid tool call parser: NAME (chose from { ... })``, the line
``VllmServerError`` reports.
"""

from __future__ import annotations

import re
from typing import Annotated

import typer

from flywheel.cli.common import usage

DEFAULT_MAX_MODEL_LEN = 2048  # infra.engine.vllm_server.VllmLaunch's
DEFAULT_TOOL_CALL_PARSER = "hermes"  # the built models' chat template writes Hermes <tool_call> blocks
NO_TOOL_CALL_PARSER = "none"
_PARSER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

MaxModelLen = Annotated[
    int | None,
    typer.Option(
        "--max-model-len",
        min=16,
        help="vLLM's context: longest prompt plus completion, in tokens (default 2048).",
    ),
]
ToolCallParser = Annotated[
    str | None,
    typer.Option(
        "--tool-call-parser",
        help="vLLM's tool parser for the model's chat template (hermes; e.g. llama3_json, mistral); "
        "none: no tool parsing (agents' tool calls come back as text).",
    ),
]


def tool_call_parser(name: str | None) -> str | None:
    """The parser to launch vLLM with (``None``: no auto tool choice), or a one-line usage error (exit 2)."""
    if name is None:
        return DEFAULT_TOOL_CALL_PARSER
    if name == NO_TOOL_CALL_PARSER:
        return None
    if not _PARSER_NAME.fullmatch(name):
        usage(f"--tool-call-parser takes a vLLM tool parser's name (letters, digits, _ . -), not {name!r}")
    return name
