"""zkl's Qwen2 / Qwen3 / Qwen3-MoE forward against transformers' own model, weight for weight.

Each case builds a tiny random HF model, re-draws its weights so that every tensor matters
(random norm weights and biases, O(1) activations, a decisive router), saves it with
`save_pretrained`, reads it back through `zkl.models.hf_checkpoint` and compares logits on
one token batch, with zkl's fast ops and with every invariance fix on.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import zkl.invariance
from zkl.models.build import build_model
from zkl.models.hf_checkpoint import load_state_dict, model_config_from_hf

# Both sides run in fp32 on O(1) activations and logits (|logit| up to ~4). The two
# implementations do the same math with different reduction orders (SDPA / 16-row tiles /
# pairwise trees vs HF eager matmul-softmax) and zkl builds its RoPE tables in float64 before
# rounding to fp32 while HF computes them in fp32: each op differs by a few fp32 ulps
# (~1e-7 relative) and a few layers compound that to ~1e-6 at most. 1e-5 leaves head room
# over that while any wrong mapping (a swapped projection, a missing bias or norm, wrong
# theta/eps/head_dim, a wrong expert split) moves logits by >= 1e-2.
TOL = 1e-5

BATCH, SEQ = 2, 12
COMMON = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}

CASES = {
    "qwen2_tied": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(COMMON, num_hidden_layers=2, tie_word_embeddings=True, rms_norm_eps=1e-5),
    ),
    "qwen2_untied": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            COMMON,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        ),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            COMMON,
            num_hidden_layers=2,
            head_dim=32,  # != hidden / heads, so head_dim has to come from config.json
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            COMMON,
            num_hidden_layers=3,
            head_dim=16,
            tie_word_embeddings=False,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,  # 2*I != H: the fused layouts are unambiguous
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],  # layers 0 and 2 sparse, layer 1 dense
        ),
    ),
}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights that make every tensor count: W ~ N(0, 1/fan_in), norms ~ U(0.5, 1.5),
    biases ~ N(0, 0.5), router ~ N(0, 1) so top-k is decided by clear margins."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                new = 0.5 + torch.rand(p.shape, generator=gen)
            elif name.endswith("bias"):
                new = 0.5 * torch.randn(p.shape, generator=gen)
            elif name.endswith("mlp.gate.weight"):
                new = torch.randn(p.shape, generator=gen)
            else:
                new = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])
            p.copy_(new)


def make_hf(case: str, seed: int = 0) -> torch.nn.Module:
    config_cls, model_cls, kwargs = CASES[case]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    extra = {"experts_implementation": "eager"} if "moe" in case else {}
    model = getattr(transformers, model_cls)._from_config(
        config, attn_implementation="eager", dtype=torch.float32, **extra
    )
    randomize_(model, seed + 1)
    return model.eval()


def tokens_batch(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))


def zkl_logits(model, tokens: torch.Tensor, invariant: bool) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    fixes = zkl.invariance.FIXES if invariant else ()
    with torch.no_grad(), zkl.invariance.enabled(fixes):
        return model(tokens, positions)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """case -> (checkpoint dir, HF reference logits)."""
    out = {}
    for case in CASES:
        hf = make_hf(case)
        directory = tmp_path_factory.mktemp(case)
        hf.save_pretrained(directory)
        tokens = tokens_batch(hf.config.vocab_size)
        with torch.no_grad():
            logits = hf(input_ids=tokens).logits
        out[case] = (directory, logits, hf)
    return out


@pytest.mark.parametrize("invariant", [False, True], ids=["fast", "invariant"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(saved, case, invariant):
    directory, hf_logits, hf = saved[case]
    cfg = model_config_from_hf(directory)
    assert cfg.family == hf.config.model_type
    assert cfg.checkpoint == str(directory)
    model = build_model(cfg, torch.float32).eval()
    logits = zkl_logits(model, tokens_batch(cfg.vocab_size), invariant)
    assert hf_logits.abs().max() > 1.0  # the comparison is not between near-zero numbers
    torch.testing.assert_close(logits, hf_logits, rtol=0, atol=TOL)


def test_config_mapping(saved):
    qwen2 = model_config_from_hf(saved["qwen2_tied"][0])
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.head_dim) == (True, False, 16)
    assert qwen2.tie_word_embeddings and qwen2.rms_norm_eps == 1e-5
    untied = model_config_from_hf(saved["qwen2_untied"][0], name="x")
    assert not untied.tie_word_embeddings and untied.rope.theta == 1000.0 and untied.name == "x"
    qwen3 = model_config_from_hf(saved["qwen3"][0])
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim, qwen3.rope.theta) == (
        False,
        True,
        32,
        1e6,
    )
    moe = model_config_from_hf(saved["qwen3_moe"][0])
    experts = moe.moe
    assert (experts.num_experts, experts.num_experts_per_tok, experts.intermediate_size) == (
        4,
        2,
        24,
    )
    assert experts.norm_topk_prob and experts.mlp_only_layers == [1]
    assert [moe.layer_is_moe(i) for i in range(3)] == [True, False, True]


def test_untied_lm_head_is_its_own_tensor(saved):
    cfg = model_config_from_hf(saved["qwen2_untied"][0])
    sd = load_state_dict(cfg.checkpoint, cfg)
    assert not torch.equal(sd["lm_head.weight"], sd["embed_tokens.weight"])
    assert all(t.dtype == torch.float32 for t in sd.values())


def _write_checkpoint(directory, config: dict, tensors: dict, shards: int = 1) -> None:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    keys = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in keys}, directory / "model.safetensors")
        return
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[s::shards]
        save_file({k: tensors[k].contiguous() for k in part}, directory / name)
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("layout", ["fused", "fused_transposed"])
def test_moe_fused_experts_and_shards(saved, tmp_path, layout):
    """The transformers 5 in-memory layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]),
    and its transpose, sharded with an index, load to the same weights as per-expert files."""
    directory, _, hf = saved["qwen3_moe"]
    config = json.loads((directory / "config.json").read_text())
    tensors = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    assert tensors["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 48, 64)
    assert tensors["model.layers.0.mlp.experts.down_proj"].shape == (4, 64, 24)
    if layout == "fused_transposed":
        for k in list(tensors):
            if ".mlp.experts." in k:
                tensors[k] = tensors[k].transpose(1, 2)
    target = tmp_path / layout
    _write_checkpoint(target, config, tensors, shards=3)
    reference_cfg = model_config_from_hf(directory)
    reference = load_state_dict(directory, reference_cfg)
    cfg = model_config_from_hf(target)
    loaded = load_state_dict(target, cfg)
    assert loaded.keys() == reference.keys()
    for k in reference:
        assert torch.equal(loaded[k], reference[k]), k


def test_unsupported_model_type_raises(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "hidden_size": 8}))
    with pytest.raises(ValueError, match="gpt2"):
        model_config_from_hf(tmp_path)


def _config_variant(saved, tmp_path, **changes):
    directory = saved["qwen3"][0]
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_rope_scaling_and_sliding_window_raise(saved, tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="yarn"):
        model_config_from_hf(_config_variant(saved, tmp_path, rope_parameters=yarn))
    legacy = {"type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="linear"):
        model_config_from_hf(
            _config_variant(saved, tmp_path, rope_parameters=None, rope_scaling=legacy)
        )
    with pytest.raises(ValueError, match="sliding"):
        model_config_from_hf(_config_variant(saved, tmp_path, use_sliding_window=True))


def test_legacy_rope_theta_key(saved, tmp_path):
    """transformers 4 configs carry a top-level rope_theta and rope_scaling null."""
    directory = _config_variant(
        saved, tmp_path, rope_parameters=None, rope_scaling=None, rope_theta=5e5
    )
    assert model_config_from_hf(directory).rope.theta == 5e5


def test_missing_key_and_bad_shape_raise(saved, tmp_path):
    directory = saved["qwen2_untied"][0]
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    tensors["model.extra.weight"] = torch.zeros(2)
    _write_checkpoint(tmp_path / "missing", config, tensors)
    cfg = model_config_from_hf(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"missing keys: layers\.1\.self_attn\.k_proj\.bias"):
        load_state_dict(cfg.checkpoint, cfg)
    with pytest.raises(ValueError, match=r"unexpected keys: extra\.weight"):
        load_state_dict(cfg.checkpoint, cfg)

    _write_checkpoint(
        tmp_path / "shape",
        dict(config, intermediate_size=96),
        dict(load_file(directory / "model.safetensors")),
    )
    cfg = model_config_from_hf(tmp_path / "shape")
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.down_proj\.weight: checkpoint"):
        load_state_dict(cfg.checkpoint, cfg)


def test_qwen3_attention_bias_raises(saved, tmp_path):
    """HF Qwen3 with attention_bias=true also puts a bias on o_proj, which zkl lacks."""
    with pytest.raises(ValueError, match="o_proj"):
        model_config_from_hf(_config_variant(saved, tmp_path, attention_bias=True))
