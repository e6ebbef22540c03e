"""The memory estimate holds what lives at once: the lasting buffers (weights, optimizer
state, caches, records) and the largest of a step's phases (generation, scoring, update),
whose transient buffers never coexist."""

from __future__ import annotations

import pytest

from tests.conftest import make_cfg
from zkl import memory
from zkl.errors import ConfigError

# the RL-shaped bench's step in default mode: 4k-token prompts, 4k-token responses, 64 rollouts
RL_SHAPE = [
    "model=qwen2_5_1_5b", "task.name=residue", "task.min_prompt_len=4064",
    "task.max_prompt_len=4064", "sampling.max_new_tokens=4096", "rl.prompts_per_step=8",
    "rl.samples_per_prompt=8", "scheduler.max_batch_size=64", "rl.score_micro_batch=8",
    "rl.num_minibatches=64", "trainer.activation_checkpointing=true",
    "scheduler.prefill_chunk=512", "zero_train_gen_mismatch=false",
]  # fmt: skip


def test_peak_is_the_lasting_parts_and_the_largest_phase():
    parts = {
        "weights and optimizer state": 10.0,
        "KV cache": 3.0,
        "generation activations": 2.0,
        "scoring logits": 4.0,
        "update activations": 5.0,
        "Mamba chunk scan": 1.0,
    }
    assert memory.peak(parts) == 10.0 + 3.0 + max(2.0, 4.0 + 1.0, 5.0 + 1.0)
    assert memory.peak({"weights and optimizer state": 10.0}) == 10.0


def test_a_shape_whose_phases_fit_is_not_refused(monkeypatch):
    """The default mode's RL step fits an 80 GB GPU by its phases, not by their sum."""
    monkeypatch.setattr(memory, "on_cuda", lambda cfg: True)  # CUDA's kernels, estimated here
    cfg = make_cfg(*RL_SHAPE)
    parts = memory.estimate(cfg, 4096 + 4096)
    gpu = {k: v for k, v in parts.items() if k not in memory.HOST_ONLY}
    assert memory.peak(gpu) < 80e9 < sum(gpu.values())
    monkeypatch.setattr(memory.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory.torch.cuda, "mem_get_info", lambda *device: (80e9, 80e9))
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**13)
    memory.check_memory(cfg, 4096 + 4096)  # no refusal
    monkeypatch.setattr(memory.torch.cuda, "mem_get_info", lambda *device: (60e9, 80e9))
    with pytest.raises(ConfigError, match="60.0 GB free"):
        memory.check_memory(cfg, 4096 + 4096)
