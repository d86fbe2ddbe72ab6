"""The engines a demo seed starts beside its stack, and the baseline's weights served through it.

vLLM on the warm start (``--engine vllm``), a frozen engine for an agent's fixed roles (the SQL
agent's checker), and the SFT-only baseline's weights served as the next version through the
weight-update protocol.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from examples.demo.agents import DemoAgent
from flywheel.stack import EmbeddedStack
from infra.engine.process import EngineProcess
from infra.engine.vllm_server import VllmLaunch, VllmServer
from trainer.config import LoraOptions
from trainer.weights import WeightUpdate

if TYPE_CHECKING:
    from examples.demo.run import DemoConfig, Say


async def stop_engines(fixed: EngineProcess | None, vllm: VllmServer | None) -> None:
    """Stop whichever of the two engines beside the stack were started."""
    if fixed is not None:
        await fixed.stop()
    if vllm is not None:
        await asyncio.to_thread(vllm.stop)


async def start_vllm(
    cfg: DemoConfig, warm_dir: Path, seed_dir: Path, name: str, say: Say, *, lora: LoraOptions | None = None
) -> VllmServer:
    """vLLM on the warm start for this seed's run (2-4 minutes to start on 2 cores), its context the
    model's own (the demo's model has 512 positions; vLLM refuses a longer ``max_model_len``); with
    ``lora``, LoRA adapters of its rank loadable at runtime."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])

    positions = json.loads((warm_dir / "config.json").read_text()).get("max_position_embeddings", 2048)
    launch = VllmLaunch(
        model=warm_dir,
        served_model_name=name,
        port=port,
        max_model_len=min(int(positions), 2048),
        enable_lora=lora is not None,
        max_lora_rank=max(16, lora.rank if lora is not None else 0),
    )
    say(f"[seed {cfg.seed}] starting vLLM on the warm start (log {seed_dir / 'vllm.log'})")
    await asyncio.to_thread(seed_dir.mkdir, parents=True, exist_ok=True)
    server = await asyncio.to_thread(VllmServer.start, launch, log_path=seed_dir / "vllm.log")
    say(f"[seed {cfg.seed}] vLLM serving at {server.url}")
    return server


async def start_fixed_engine(
    agent: DemoAgent, cfg: DemoConfig, warm_dir: Path, seed_dir: Path, say: Say
) -> EngineProcess | None:
    """A second engine serving the warm start, frozen, for the agent's fixed roles (None: it has none).
    The gateway routes those roles' model names to it; the trainer's weight updates never reach it."""
    if not agent.fixed_models:
        return None
    if not cfg.engine_process:
        raise ValueError(f"the {agent.name} demo's fixed roles need engine_process (their own engine)")
    await asyncio.to_thread(seed_dir.mkdir, parents=True, exist_ok=True)
    fixed = await EngineProcess.start(
        warm_dir,
        log_path=seed_dir / "fixed-engine.log",
        model_name=agent.fixed_models[0],
        max_num_seqs=max(64, cfg.batch_groups * cfg.group_size),
        threads=cfg.threads or None,
    )
    say(f"[seed {cfg.seed}] fixed roles {', '.join(agent.fixed_models)}: the warm start at {fixed.url}")
    return fixed


async def serve_weights(stack: EmbeddedStack, model_dir: Path) -> None:
    """Serve ``model_dir``'s weights as the next version, through the weight-update protocol."""
    assert stack.trainer is not None
    state: dict[str, torch.Tensor] = load_file(str(model_dir / "model.safetensors"))
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    version = stack.trainer.weights.serving_version + 1
    # The state for an in-process engine, the directory for one behind HTTP (``engine_process``).
    result = await stack.trainer.weights.update(WeightUpdate(version, lambda: state, model_dir))
    if not result.activated:
        raise RuntimeError(f"could not serve the SFT-only baseline (version {version})")
