"""``flywheel demo --model smollm2 --task bfcl`` at toy size on the live vLLM: SmolLM2-135M-Instruct
answers BFCL questions through the gateway (the BFCL agent, a plain ``openai`` program), the reward
service scores them against BFCL's accepted values, the trainer takes a step on this CPU, and the new
version is loaded into vLLM: the held-out questions asked after training are answered by version ≥ 1,
those before by version 0. With ``--policies shared`` the same, one LoRA adapter trained over the frozen
SmolLM2 and loaded into vLLM in place: the adapter serves every call, its version 0 before training and
≥ 1 after. The full-size run (30 minutes, 100 held-out questions, three
seeds) is docs/demos.md's; this test proves the loop, not the gain."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from examples.demo.pretrained import HELDOUT, split
from tests.vllm.served import restore_base_weights

pytestmark = pytest.mark.timeout(900)
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_smollm2_demo_trains_on_bfcl_and_reloads_vllm(
    warm: str, vllm_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flywheel.cli.main", "demo", "--model", "smollm2", "--task", "bfcl"]
    cmd += ["--tiny", "--vllm", warm, "--out", str(out)] + (["--policies", "shared"] if lora else [])
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=840, check=False
        )
    finally:  # the served model again, for the tests that follow
        restore_base_weights(warm, vllm_model_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "seed-0" / "report.json").read_text())
    shutil.rmtree(out)  # the versions the trainer exported for vLLM: ~2 GB the test run need not keep
    print("SMOLLM2-DEMO", json.dumps({k: report[k] for k in ("before", "after", "delta", "rl_steps")}))
    assert report["model"] == "smollm2" and report["task"] == "bfcl/simple_python"
    assert report["rl_steps"] >= 1
    [step] = report["steps"][:1]
    assert step["episodes_trained"] == 2 and step["response_tokens"] > 0  # one group of G = 2 answers
    before, after = report["before"], report["after"]
    assert before["episodes"] == after["episodes"] == 2 and before["errors"] == after["errors"] == 0
    assert before["weight_versions"] == [0]  # the held-out questions, answered by the served model...
    if lora:  # ...every call served by the adapter, which vLLM reloaded after training
        assert report["policies_config"] == "shared"
        [(model, served_before)] = before["adapters_by_model"].items()
        assert served_before == {"shared": [0]}
        assert list(after["adapters_by_model"][model]) == ["shared"]
        assert min(after["adapters_by_model"][model]["shared"]) >= 1
    else:  # ...and after training by a version vLLM loaded
        assert report["policies_config"] == "full" and min(after["weight_versions"]) >= 1
    assert 0.0 <= after["reward"] <= 1.0 and "reward_points" in report["delta"]


def test_the_held_out_questions_are_one_fixed_set_disjoint_from_the_rl_stream() -> None:
    heldout, stream = split(0)
    again, other = split(1)
    assert [t.task_id for t in heldout] == [t.task_id for t in again] and len(heldout) == HELDOUT
    held = {t.task_id for t in heldout}
    first = [next(stream).task_id for _ in range(300)]
    assert len(set(first)) == 300 and not held & set(first)  # one pass: the other 300, none held out
    assert first[:10] != [next(other).task_id for _ in range(10)]  # each seed its own order
