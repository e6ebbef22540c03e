"""zkl's Llama and Mistral forward against transformers' own models, weight for weight.

Tiny checkpoints written by `save_pretrained`: Llama with llama3 RoPE scaling (and, apart,
linear scaling) and every bias on, at a sequence past the original context the scaling
bends; Mistral with a sliding window shorter than the sequence. Logits are compared in fp32
(tolerance of tests/models/test_hf_peer.py: 1e-5, a few ulps compounded, while a wrong mapping
moves them by >= 1e-2) and in bf16 (both sides in bf16: `BF16_TOL` below).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.models.test_hf_peer import COMMON as PEER_COMMON
from tests.models.test_hf_peer import TOL, randomize_, zkl_logits
from zkl.models.build import build_model
from zkl.models.config import replaced
from zkl.models.hf_checkpoint import model_config_from_hf

# bf16 logits of |x| <= ~4 after 2 layers: each side rounds every activation to 8 bits of
# mantissa in different places (zkl's fused q/k/v and fp32 norms vs HF's), so the two
# differ by a few bf16 ulps of the logits: measured at most 0.089 (zkl bf16 vs HF bf16),
# as much as HF's own bf16 differs from its fp32 (0.090); fp32 differs by <= 3.8e-6.
BF16_TOL = 0.15

BATCH, SEQ = 2, 40
COMMON = {**PEER_COMMON, "num_hidden_layers": 2, "tie_word_embeddings": False}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # SEQ runs past it
}
CASES = {
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(COMMON, rope_parameters=LLAMA3_ROPE, attention_bias=True, mlp_bias=True),
    ),
    "llama_linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(COMMON, head_dim=32, rope_parameters={"rope_type": "linear", "factor": 2.0}),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=8)),
}


def make_hf(case: str, seed: int = 0) -> torch.nn.Module:
    config_cls, model_cls, kwargs = CASES[case]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)._from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(model, seed + 1)
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """case -> (checkpoint dir, tokens, HF fp32 logits, HF bf16 logits)."""
    out = {}
    for case in CASES:
        hf = make_hf(case)
        directory = tmp_path_factory.mktemp(case)
        hf.save_pretrained(directory)
        tokens = torch.randint(0, 96, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            fp32 = hf(input_ids=tokens).logits
            bf16 = hf.to(torch.bfloat16)(input_ids=tokens).logits.float()
        out[case] = (directory, tokens, fp32, bf16)
    return out


def test_configs_read_from_the_checkpoints(saved):
    llama = model_config_from_hf(saved["llama3"][0])
    assert (llama.family, llama.rope.type, llama.rope.factor) == ("llama", "llama3", 4.0)
    assert llama.rope.original_max_position_embeddings == 16
    assert llama.qkv_bias and llama.o_proj_bias and llama.mlp_bias and not llama.qk_norm
    linear = model_config_from_hf(saved["llama_linear"][0])
    assert (linear.rope.type, linear.rope.factor, linear.head_dim) == ("linear", 2.0, 32)
    mistral = model_config_from_hf(saved["mistral"][0])
    assert (mistral.family, mistral.sliding_window) == ("mistral", 8)


@pytest.mark.parametrize("invariant", [False, True], ids=["fast", "invariant"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp32_logits_match_hf(saved, case, invariant):
    directory, tokens, hf_logits, _ = saved[case]
    model = build_model(model_config_from_hf(directory), torch.float32).eval()
    got = zkl_logits(model, tokens, invariant)
    assert (got - hf_logits).abs().max().item() <= TOL
    if case == "mistral":  # the window matters: full attention would be far off
        assert model.layers[0].self_attn.window == 8


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_logits_match_hf(saved, case):
    directory, tokens, hf_fp32, hf_bf16 = saved[case]
    model = build_model(model_config_from_hf(directory), torch.bfloat16).eval()
    got = zkl_logits(model, tokens, True).float()
    assert (got - hf_bf16).abs().max().item() <= BF16_TOL
    assert (got - hf_fp32).abs().max().item() <= BF16_TOL


def test_without_the_window_or_the_scaling_the_logits_differ(saved):
    """The features are load-bearing at these lengths: turning either off moves the logits."""
    for case, key, off in (("mistral", "sliding_window", 0), ("llama3", "rope.type", "default")):
        directory, tokens, hf_logits, _ = saved[case]
        cfg = replaced(model_config_from_hf(directory), {key: off})
        model = build_model(cfg, torch.float32).eval()
        assert (zkl_logits(model, tokens, False) - hf_logits).abs().max().item() > 1e-2, case
