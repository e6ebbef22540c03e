"""zkl generation against transformers' `generate` on the same weights and batch (CUDA bench).

transformers is not a zkl dependency: it is imported only here, and a row says when it is
missing or cannot map the model.
"""

from __future__ import annotations

import torch

from zkl.experiments.timing import cuda_time
from zkl.experiments.workload import NEW_TOKENS, bench_requests
from zkl.models.hf_checkpoint import to_hf
from zkl.models.qwen_family import QWEN2
from zkl.models.registry import family


def hf_generate(model: torch.nn.Module, batch: int) -> dict[str, float] | str:
    """Tokens/s of transformers' `generate` (static cache) on the same weights and batch.

    A string says why it was skipped.
    """
    hf = hf_model(model)
    if isinstance(hf, str):
        return hf
    import transformers  # optional: hf_model has imported it

    cfg = model.cfg
    device = model.embed_tokens.weight.device
    requests = bench_requests(batch, cfg.vocab_size)
    ids = torch.tensor([r.prompt for r in requests], device=device)
    kwargs = dict(
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,  # a compile would not fit the benchmark's time budget
        pad_token_id=0,
    )
    with torch.no_grad():
        seconds = cuda_time(lambda: hf.generate(ids, **kwargs), repeats=2, warmup=1)
    return {"gen_tokens_per_s": batch * NEW_TOKENS / seconds, "version": transformers.__version__}


def hf_model(model: torch.nn.Module) -> torch.nn.Module | str:
    """transformers' Qwen2ForCausalLM holding zkl's weights (q/k/v and gate/up split back
    into HF's projections), on the model's device in bf16; a string says why not."""
    try:
        import transformers  # optional: not a zkl dependency
    except ImportError:
        return "transformers is not installed"
    cfg = model.cfg
    if family(cfg) is not QWEN2 or cfg.num_experts:
        return f"the comparison maps only dense qwen2 models, not {cfg.family}"
    hf_cfg = transformers.Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    with torch.device(model.embed_tokens.weight.device):
        hf = transformers.Qwen2ForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    state = {
        (name if name.startswith("lm_head") else f"model.{name}"): p
        for name, p in to_hf(model.state_dict(), cfg).items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        return f"weights do not map onto transformers' Qwen2: {(missing + unexpected)[:3]}"
    return hf
