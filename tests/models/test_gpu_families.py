"""The Llama, Mistral and gpt-oss families on CUDA against transformers on the same GPU.

The CPU peer tests (tests/models/test_hf_llama_peer.py, tests/models/test_gpt_oss_peer.py) hold the
checkpoints and tolerances; here both sides run on the GPU (zkl's Triton kernels in zero mode,
HF's eager attention). Stated tolerances: fp32 1e-4 (the GPU's GEMMs round differently from
the CPU's: a few ulps more than the CPU test's bound, while a wrong mapping moves logits by
>= 1e-2); bf16 the CPU tests' bounds (each side rounds its activations in different places).
"""

from __future__ import annotations

import pytest
import torch

import zkl.invariance
from tests.models import test_gpt_oss_peer as gpt_oss_peer
from tests.models import test_hf_llama_peer as llama_peer
from zkl.models.build import build_model
from zkl.models.hf_checkpoint import model_config_from_hf

pytestmark = pytest.mark.gpu
DEV = "cuda"
FP32_TOL = 1e-4


def _zkl(directory, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    model = build_model(model_config_from_hf(directory), dtype, device=DEV).eval()
    positions = torch.arange(tokens.shape[1], device=DEV).expand(tokens.shape[0], -1)
    with torch.no_grad(), zkl.invariance.enabled(zkl.invariance.FIXES):
        return model(tokens.to(DEV), positions).float()


def _hf(hf: torch.nn.Module, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        return hf.to(DEV, dtype)(input_ids=tokens.to(DEV)).logits.float()


@pytest.mark.parametrize("case", list(llama_peer.CASES))
def test_llama_and_mistral_match_transformers_on_the_gpu(tmp_path, case):
    hf = llama_peer.make_hf(case)
    hf.save_pretrained(tmp_path)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 96, (llama_peer.BATCH, llama_peer.SEQ), generator=gen)
    fp32 = (_zkl(tmp_path, tokens, torch.float32) - _hf(hf, tokens, torch.float32)).abs().max()
    assert fp32.item() <= FP32_TOL, case
    bf16 = (_zkl(tmp_path, tokens, torch.bfloat16) - _hf(hf, tokens, torch.bfloat16)).abs().max()
    assert bf16.item() <= llama_peer.BF16_TOL, case


def test_gpt_oss_matches_transformers_on_the_gpu(tmp_path):
    hf = gpt_oss_peer.make_hf()
    hf.save_pretrained(tmp_path)
    tokens = gpt_oss_peer.tokens_batch()
    fp32 = (_zkl(tmp_path, tokens, torch.float32) - _hf(hf, tokens, torch.float32)).abs().max()
    assert fp32.item() <= FP32_TOL
    bf16 = (_zkl(tmp_path, tokens, torch.bfloat16) - _hf(hf, tokens, torch.bfloat16)).abs().max()
    assert bf16.item() <= gpt_oss_peer.TOL[torch.bfloat16]
