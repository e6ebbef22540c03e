"""A gpt-oss checkpoint: its hostile forms are one sentence before any model is built, and
`model.checkpoint=DIR` alone validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import make_cfg
from tests.models.test_gpt_oss_peer import make_hf
from tests.models.test_hf_weights_check import refusal
from zkl.models import mxfp4
from zkl.run.validate import validate


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gpt_oss")
    make_hf().save_pretrained(directory)
    return directory


def _rewrite(source: Path, target: Path, edit, config_edit=None) -> Path:
    """`source` with its tensors edited by `edit(tensors)` (and config by `config_edit`)."""
    tensors = load_file(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    edit(tensors)
    if config_edit:
        config_edit(config)
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    save_file(tensors, target / "model.safetensors")
    return target


def _to_mxfp4(tensors: dict) -> None:
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, k_in, n_out = tensors.pop(key).shape
        tensors[key + "_blocks"] = torch.zeros(e, n_out, k_in // 32, 16, dtype=torch.uint8)
        tensors[key + "_scales"] = torch.full((e, n_out, k_in // 32), 127, dtype=torch.uint8)


def _mxfp4_config(config: dict) -> None:
    config["quantization_config"] = {"quant_method": "mxfp4"}


def test_bf16_and_mxfp4_checkpoints_validate(saved, tmp_path):
    validate(make_cfg(f"model.checkpoint={saved}"))
    validate(
        make_cfg(f"model.checkpoint={_rewrite(saved, tmp_path / 'q', _to_mxfp4, _mxfp4_config)}")
    )


def test_mxfp4_blocks_of_a_wrong_shape(saved, tmp_path):
    def edit(tensors):
        _to_mxfp4(tensors)
        key = "model.layers.0.mlp.experts.gate_up_proj_blocks"
        tensors[key] = tensors[key][..., :8].contiguous()

    message = refusal(_rewrite(saved, tmp_path / "q", edit, _mxfp4_config))
    assert "gate_up_proj_blocks has shape [4, 64, 2, 8]" in message


def test_mxfp4_blocks_without_scales(saved, tmp_path):
    def edit(tensors):
        _to_mxfp4(tensors)
        del tensors["model.layers.1.mlp.experts.down_proj_scales"]

    message = refusal(_rewrite(saved, tmp_path / "q", edit, _mxfp4_config))
    assert "down_proj_blocks has no layers.1.mlp.experts.down_proj_scales" in message


def test_mxfp4_blocks_that_dequantize_to_a_wrong_matrix(saved, tmp_path):
    """Blocks and scales agree with each other but not with config.json's sizes."""

    def edit(tensors):
        _to_mxfp4(tensors)
        for part in ("blocks", "scales"):
            key = f"model.layers.2.mlp.experts.down_proj_{part}"
            tensors[key] = tensors[key][:, :32].contiguous()

    message = refusal(_rewrite(saved, tmp_path / "q", edit, _mxfp4_config))
    assert "layers.2.mlp.experts.down_proj has shape [4, 32, 32]" in message


def test_a_sink_tensor_of_the_wrong_size(saved, tmp_path):
    def edit(tensors):
        tensors["model.layers.1.self_attn.sinks"] = torch.zeros(3)

    message = refusal(_rewrite(saved, tmp_path / "s", edit))
    assert "layers.1.self_attn.sinks: checkpoint [3] vs config [4]" in message


def test_an_unknown_quantization_is_refused(saved, tmp_path):
    def config_edit(config):
        config["quantization_config"] = {"quant_method": "gptq"}

    message = refusal(_rewrite(saved, tmp_path / "g", lambda t: None, config_edit))
    assert "quant_method='gptq'" in message


def test_dequantize_exact_values():
    """Code 0x21 is E2M1 (0.5, 1.0) low nibble first; scale 128 doubles them."""
    blocks = torch.full((1, 1, 16), 0x21, dtype=torch.uint8)
    blocks[0, 0, 1] = 0x9F  # low 15 -> -6.0, high 9 -> -0.5
    out = mxfp4.dequantize(blocks, torch.full((1, 1), 128, dtype=torch.uint8))
    assert out[0, :4].tolist() == [1.0, 2.0, -12.0, -1.0]
