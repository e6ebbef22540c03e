"""zkl's weights written as an HF checkpoint (`zkl.models.hf_export`): read back by
`model.checkpoint` bit for bit, and by transformers with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import make_cfg
from zkl.models.build import build_model
from zkl.models.config import value_at
from zkl.models.hf_export import hf_config, save_checkpoint

# transformers' Qwen3 against zkl on the same fp32 weights: the same math in other orders
# (zkl's fixed GEMM tiles, RoPE tables built in float64); measured 2.4e-7 on |logits| <= 1.2.
HF_FP32_TOL = 1e-4


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_written_checkpoint_reads_back_bit_for_bit(model, tmp_path):
    cfg = make_cfg(f"model={model}").model
    ours = build_model(cfg, torch.float32, seed=11)
    save_checkpoint(ours, tmp_path)
    back_cfg = make_cfg(f"model.checkpoint={tmp_path}").model
    for key in ("family", "hidden_size", "num_hidden_layers", "moe.num_experts", "qk_norm"):
        assert value_at(back_cfg, key) == value_at(cfg, key), key
    back = build_model(back_cfg, torch.float32)
    theirs = back.state_dict()
    assert set(theirs) == set(ours.state_dict())
    assert all(torch.equal(v, theirs[k]) for k, v in ours.state_dict().items())
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == cfg.family


def test_transformers_reads_the_written_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = make_cfg("model=tiny_dense").model
    ours = build_model(cfg, torch.float32, seed=5)
    save_checkpoint(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = torch.randint(2, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        diff = (hf(tokens).logits - ours(tokens, positions)).abs().max().item()
    assert diff < HF_FP32_TOL, diff


def test_a_family_zkl_does_not_write_is_refused_by_name():
    cfg = make_cfg("model=tiny_hybrid").model
    with pytest.raises(ValueError, match="not 'nemotron_h'") as err:
        hf_config(cfg)
    assert "\n" not in str(err.value)


def test_numbers_the_family_reader_cannot_give_back_are_refused(tmp_path):
    """Qwen3's config.json has no switch for qk-norm: a Qwen3 without it would read back
    as another model, so it is not written."""
    cfg = make_cfg("model=tiny_dense", "model.qk_norm=false").model
    with pytest.raises(ValueError, match=r"model\.qk_norm=False cannot be written"):
        save_checkpoint(build_model(cfg, torch.float32), tmp_path)
    assert not (tmp_path / "config.json").exists()
