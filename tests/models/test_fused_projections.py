"""q/k/v and gate/up fused in the model (`qkv_proj`, `gate_up_proj`): loaded from an HF
checkpoint's separate projections, the fused model computes what the separate projections
compute; the seeded init draws each part as the separate projection it stands for; and
per-tensor FP8 keeps one scale per part, as separate projections have."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.models.test_hf_peer import make_hf, tokens_batch
from zkl.models.build import build_model
from zkl.models.config import ModelConfig
from zkl.models.fused import init_order
from zkl.models.hf_checkpoint import model_config_from_hf
from zkl.models.transformer import Linear, Transformer
from zkl.precision.fp8_tensor import fake_quantize_fp8_tensor, fp8_tensor_scale
from zkl.precision.mx import fake_quantize_mxfp8
from zkl.precision.recipes import linear_weight_and_input, quantize_parts

CASES = ("qwen2_untied", "qwen3_moe")  # q/k/v with biases; MoE experts' and dense gate/up
# fp32 on O(1) logits (test_hf_peer's weights). One GEMM over the fused weight and one per
# part differ at most in summation order inside the GEMM library: ~1e-7 relative an op, a
# few layers compound that below 1e-6; a wrong part order, a swapped part or a missing bias
# moves the logits by >= 1e-2.
TOL = 1e-5
QUANTIZERS = {"none": lambda t: t, "fp8_tensor": fake_quantize_fp8_tensor}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> an HF checkpoint directory written by transformers' `save_pretrained`."""
    out = {}
    for case in CASES:
        directory = tmp_path_factory.mktemp(case)
        make_hf(case).save_pretrained(directory)
        out[case] = directory
    return out


def _hf_tensors(directory) -> dict[str, torch.Tensor]:
    return {
        k.removeprefix("model."): v for k, v in load_file(directory / "model.safetensors").items()
    }


def _fused_linears(model) -> list[tuple[str, Linear]]:
    """(parent module name, Linear) of every fused projection."""
    return [
        (name.rpartition(".")[0], m)
        for name, m in model.named_modules()
        if isinstance(m, Linear) and m.parts
    ]


def _use_separate_projections(model, hf: dict[str, torch.Tensor], quantize) -> None:
    """Each fused Linear computes from the checkpoint's separate tensors instead: one
    `F.linear` per part on the quantized input and the part's own quantized weight."""
    for parent, linear in _fused_linears(model):
        weights = [hf[f"{parent}.{part}.weight"] for part in linear.parts]
        biases = [hf.get(f"{parent}.{part}.bias") for part in linear.parts]

        def separate(x, weights=weights, biases=biases):
            outs = [F.linear(quantize(x), quantize(w), b) for w, b in zip(weights, biases)]
            return torch.cat(outs, dim=-1)

        linear.forward = separate


@pytest.mark.parametrize("recipe", ["none", "fp8_tensor"])
@pytest.mark.parametrize("case", CASES)
def test_fused_model_gives_the_logits_of_separate_projections(checkpoints, case, recipe):
    cfg = model_config_from_hf(checkpoints[case])
    tokens = tokens_batch(cfg.vocab_size)
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    model = build_model(cfg, torch.float32, recipe).eval()
    assert _fused_linears(model)
    with torch.no_grad():
        fused = model(tokens, positions)
        _use_separate_projections(model, _hf_tensors(checkpoints[case]), QUANTIZERS[recipe])
        separate = model(tokens, positions)
    assert separate.abs().max() > 1.0  # not a comparison of near-zero numbers
    torch.testing.assert_close(fused, separate, rtol=0, atol=TOL)


@pytest.mark.parametrize("case", CASES)
def test_fp8_tensor_keeps_one_scale_per_part(checkpoints, case):
    """The fused weight's per-tensor scales are the separate projections' scales, bit for bit,
    and its quantized weight theirs concatenated; one scale over the fused weight would not
    be (it differs in some weight of every case)."""
    cfg = model_config_from_hf(checkpoints[case])
    hf = _hf_tensors(checkpoints[case])
    model = build_model(cfg, torch.float32, "fp8_tensor")
    whole_differs = 0
    for parent, linear in _fused_linears(model):
        separate = [hf[f"{parent}.{part}.weight"] for part in linear.parts]
        scales: list[torch.Tensor] = []

        def recording(t: torch.Tensor, scales=scales) -> torch.Tensor:
            scales.append(fp8_tensor_scale(t))
            return fake_quantize_fp8_tensor(t)

        weight = linear.weight.detach()
        per_part = quantize_parts(recording, weight, list(linear.parts.values()))
        assert len(scales) == len(separate)
        for got, w in zip(scales, separate):
            assert torch.equal(got, fp8_tensor_scale(w))
        expected = torch.cat([fake_quantize_fp8_tensor(w) for w in separate])
        assert torch.equal(per_part, expected)
        x = torch.randn(2, weight.shape[1])
        with torch.no_grad():
            assert torch.equal(linear_weight_and_input(linear, x)[0], expected)  # what runs
        whole_differs += not torch.equal(fake_quantize_fp8_tensor(weight), expected)
    assert whole_differs > 0


def test_mxfp8_of_a_fused_weight_is_the_same_part_by_part():
    """MXFP8 scales 32 elements of one row along K; fusing along N changes no bit."""
    model = build_model(ModelConfig(family="qwen2", qkv_bias=True), torch.bfloat16, seed=1)
    for _, linear in _fused_linears(model):
        weight = linear.weight.detach()
        parts = list(linear.parts.values())
        whole = fake_quantize_mxfp8(weight)
        assert torch.equal(quantize_parts(fake_quantize_mxfp8, weight, parts), whole)


def test_seeded_init_draws_each_part_as_a_separate_projection():
    """The init numbers the parameters in the order separate q/k/v and gate/up Linears would
    register them (weight, bias, next part), so a fused model starts from their values."""
    model = Transformer(ModelConfig(family="qwen2", qkv_bias=True))
    order = init_order(model)
    names = [name for name, _ in order]
    attn, mlp = "layers.0.self_attn.", "layers.0.mlp."
    start = names.index(attn + "q_proj.weight")
    expected = [attn + f"{p}_proj.{kind}" for p in "qkv" for kind in ("weight", "bias")]
    assert names[start : start + 7] == [*expected, attn + "o_proj.weight"]
    start = names.index(mlp + "gate_proj.weight")
    expected = [mlp + f"{p}_proj.weight" for p in ("gate", "up", "down")]
    assert names[start : start + 3] == expected
    fused = model.layers[0].self_attn.qkv_proj.weight
    views = [t for name, t in order if name.startswith(attn) and name.endswith("_proj.weight")]
    assert all(
        t.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr() for t in views[:3]
    )
    assert sum(t.numel() for t in views[:3]) == fused.numel()
