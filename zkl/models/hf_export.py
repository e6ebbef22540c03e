"""Writing zkl's weights as an HF checkpoint (`config.json` and `model.safetensors`), which
`model.checkpoint=DIR` and transformers read back: a warm start, or a trained policy taken
elsewhere for evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from zkl.models.config import ModelConfig, leaves, value_at
from zkl.models.hf_checkpoint import to_hf
from zkl.models.registry import FAMILIES, family


def writable() -> list[str]:
    """The families whose checkpoints zkl writes."""
    return [name for name, entry in FAMILIES.items() if entry.config_to_hf is not None]


def hf_config(cfg: ModelConfig) -> dict:
    """`cfg` as a config.json; ValueError (one sentence) where the family's reader would not
    give back the same numbers."""
    entry = family(cfg)
    if entry.config_to_hf is None:
        raise ValueError(
            f"zkl writes HF checkpoints of the families {writable()}, not {cfg.family!r}."
        )
    hf = {
        "model_type": entry.model_types[0],
        "architectures": list(entry.architectures[:1]),
        **entry.config_to_hf(cfg),
    }
    base = ModelConfig(name=cfg.name, family=cfg.family, checkpoint=cfg.checkpoint)
    back = entry.config_from_hf(json.loads(json.dumps(hf)), base)
    differ = [
        key
        for key, _ in leaves()
        if key not in ("name", "checkpoint") and value_at(back, key) != value_at(cfg, key)
    ]
    if differ:
        raise ValueError(
            f"model.{differ[0]}={value_at(cfg, differ[0])!r} cannot be written into a "
            f"{cfg.family} config.json (it reads back as {value_at(back, differ[0])!r})."
        )
    return hf


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s weights under an HF checkpoint's names: q/k/v and gate/up split into HF's
    projections (views), `model.` before all but the head, a tied lm_head left out."""
    cfg = model.cfg
    return {
        (name if name.startswith("lm_head") else f"model.{name}"): t
        for name, t in to_hf(model.native_state_dict(), cfg).items()
        if not (cfg.tie_word_embeddings and name == "lm_head.weight")
    }


def save_checkpoint(
    model: torch.nn.Module, directory: str | Path, dtype: torch.dtype = torch.float32
) -> Path:
    """`model`'s weights (`hf_state_dict`, in `dtype`) and its config.json in `directory`."""
    config = hf_config(model.cfg)
    tensors = {k: t.detach().to(dtype).cpu().contiguous() for k, t in hf_state_dict(model).items()}
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
