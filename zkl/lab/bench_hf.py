"""zkl generation against transformers' `generate` on the same weights and batch (CUDA bench).

transformers is not a zkl dependency: it is imported only here, and a row says when it is
missing or cannot map the model.
"""

from __future__ import annotations

import torch

from zkl.lab.timing import cuda_time
from zkl.lab.workload import NEW_TOKENS, bench_requests
from zkl.models.hf_export import hf_config, hf_state_dict
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
    if family(cfg) is not QWEN2 or cfg.is_moe:
        return f"the comparison maps only dense qwen2 models, not {cfg.family}"
    try:
        hf_cfg = transformers.Qwen2Config(**hf_config(cfg))
    except ValueError as err:
        return str(err)
    with torch.device(model.embed_tokens.weight.device):
        hf = transformers.Qwen2ForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        return f"weights do not map onto transformers' Qwen2: {(missing + unexpected)[:3]}"
    return hf
