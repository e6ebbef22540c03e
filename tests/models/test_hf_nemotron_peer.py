"""zkl's Nemotron-H hybrid against transformers' `NemotronHForCausalLM`, weight for weight.

A tiny random HF model with every layer kind (Mamba2, MLP, attention, MoE) gets random
weights where HF initialises constants (norms, A_log, D, dt_bias, router bias), so every
tensor matters; it is written by `save_pretrained`, read back by
`zkl.models.hf_checkpoint`, and both run in fp32 on the CPU (HF's pure-PyTorch Mamba path).
"""

from __future__ import annotations

import torch
import transformers

import zkl.invariance
from zkl.models.build import build_model
from zkl.models.hf_checkpoint import model_config_from_hf

# Both sides compute in fp32; they differ in reduction orders (einsum vs pairwise trees,
# conv1d vs taps added in order, HF's segment sums vs a running cumulative sum, HF's sum
# over all earlier chunks vs zkl's chunk-by-chunk state passing): a few fp32 ulps per op,
# ~1e-6 after the stack on O(1) logits. A wrong mapping (a swapped split of in_proj, the
# group of the gated norm, a missing dt clamp or D skip, the router bias) moves logits by
# >= 1e-2. Measured (CPU, torch 2.13): 2.7e-6 with fast ops, 3.5e-6 with every fix on.
TOL = 2e-5
SEQ = 21  # three chunks of 8, the last partial


def _hf_model(tmp_path):
    cfg = transformers.NemotronHConfig(
        vocab_size=96,
        hidden_size=64,
        layers_block_type=["linear_attention", "mlp", "full_attention", "moe", "linear_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        ssm_state_size=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=2,
        chunk_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        routed_scaling_factor=2.5,
        max_position_embeddings=128,
        time_step_min=0.01,
    )
    torch.manual_seed(0)
    model = transformers.NemotronHForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith(("D", "dt_bias", "norm.weight", "norm_f.weight")):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.1, 0.1)
    model.save_pretrained(tmp_path)
    return model


def test_nemotron_h_logits_match_transformers(tmp_path):
    hf = _hf_model(tmp_path)
    cfg = model_config_from_hf(tmp_path)
    assert cfg.hybrid_override_pattern == "M-*EM"
    tokens = torch.randint(0, 96, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(tokens).logits
        model = build_model(cfg, torch.float32)
        positions = torch.arange(SEQ).expand(2, SEQ)
        for fixes in (frozenset(), frozenset(zkl.invariance.FIXES)):
            with zkl.invariance.enabled(fixes):
                got = model(tokens, positions)
            diff = (got - want).abs().max().item()
            assert diff < TOL, f"max |logit diff| {diff:.3g} with fixes {sorted(fixes)}"
    assert want.abs().max() > 1.0  # logits are O(1): the tolerance is relative to real values
