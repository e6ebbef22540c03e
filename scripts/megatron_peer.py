"""Peer check: a megatron engine and native on the same weights (CUDA), printed as numbers.

Default mode: max |Δ logit| and max |Δ logprob| (each engine's own kernels); zero mode:
whether the logprobs are bitwise equal (zkl's kernels in every slot of both).
`python scripts/megatron_peer.py [ENGINE]` (megatron_local unless named) on a machine with
CUDA and megatron-core (and Transformer Engine for its two engines).
"""

from __future__ import annotations

import sys

import torch

from zkl import invariance
from zkl.megatron.model import build_megatron_model
from zkl.models.build import build_model
from zkl.run.compose import compose
from zkl.trainer.scoring import sequence_logprobs


def main(engine: str) -> None:
    for name in ("tiny_dense", "tiny_moe"):
        cfg = compose([f"model={name}"]).model
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, cfg.vocab_size, (8, 48), generator=g).cuda()
        positions = torch.arange(48, device="cuda").expand(8, 48)
        mega = build_megatron_model(cfg, engine, torch.bfloat16, 0, "cuda")
        native = build_model(cfg, torch.bfloat16, seed=0, device="cuda")
        for mode, fixes in (("default", ()), ("zero", invariance.FIXES)):
            with invariance.enabled(fixes), torch.no_grad():
                a, b = mega(tokens, positions).float(), native(tokens, positions).float()
                la = sequence_logprobs(mega, tokens, 1.0)
                lb = sequence_logprobs(native, tokens, 1.0)
            print(
                f"{engine} {name} {mode}: max|dlogit| {(a - b).abs().max().item():.3e} "
                f"max|dlogprob| {(la - lb).abs().max().item():.3e} "
                f"logprobs bitwise equal: {torch.equal(la, lb)}"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "megatron_local")
