"""Read a Hugging Face checkpoint of a registered family into zkl's names.

A checkpoint is a directory with `config.json` and `*.safetensors` (one file, or shards listed
in `model.safetensors.index.json`). zkl's parameter names are HF's without the `model.`
prefix, except that zkl fuses q/k/v (`qkv_proj`) and gate/up (`gate_up_proj`), which HF
stores as separate projections: names and shapes are checked in HF's separate form, then the
parts are concatenated (`zkl.models.fused`). The MoE experts may be stored per expert (the layout
of released Qwen3-MoE checkpoints and what `save_pretrained` of transformers 5 writes, since
it converts back on save) or fused as in transformers 5's in-memory module
(`mlp.experts.gate_up_proj` [E, 2*I, H] with gate rows first, `mlp.experts.down_proj`
[E, H, I]; the transposed forms [E, H, 2*I] / [E, I, H] are accepted too).

A family's own renames (Nemotron-H's `backbone.`, `embeddings`, `norm_f`) and stored forms
come from its registry entry (`zkl.models.registry`); `config.json` is read by the family's
`config_from_hf`.

Nothing here imports transformers: the reader is plain JSON + safetensors.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from zkl.models.config import ModelConfig
from zkl.models.fused import Layout, fused_layout, join_fused, split_fused
from zkl.models.hf_config import read_config
from zkl.models.hf_weight_files import safetensors_files
from zkl.models.registry import build_on_meta, family, family_of_hf, validate_model

# Keys some (older) checkpoints carry that are not weights: recomputed from the config.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_FUSED_EXPERTS = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def model_config_from_hf(path: str | Path, name: str | None = None) -> ModelConfig:
    """The ModelConfig of an HF checkpoint directory (`checkpoint` set to `path`)."""
    path = Path(path)
    hf = read_config(path)
    entry = family_of_hf(hf)
    base = ModelConfig(name=name or path.resolve().name, family=entry.name, checkpoint=str(path))
    cfg = entry.config_from_hf(hf, base)
    validate_model(cfg)
    return cfg


def _read_tensors(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            names = f.keys()
            for key in names:
                if key in tensors:
                    raise ValueError(f"tensor {key!r} appears in more than one safetensors file.")
                tensors[key] = f.get_tensor(key)
    return tensors


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _per_expert(tensor: torch.Tensor, key: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """`tensor` as [E, rows, cols] = `shape`: stored so, or as each expert's transpose (on a
    tie, as `shape`)."""
    e, rows, cols = shape
    if tuple(tensor.shape) == shape:
        return tensor
    if tuple(tensor.shape) == (e, cols, rows):
        return tensor.transpose(1, 2)
    raise ValueError(
        f"checkpoint tensor model.{key} has shape {list(tensor.shape)}; config.json implies "
        f"{list(shape)} (or {[e, cols, rows]})."
    )


def _unfuse_experts(
    key: str, tensor: torch.Tensor, cfg: ModelConfig, out: dict[str, torch.Tensor]
) -> None:
    """Split a transformers 5 fused experts tensor into per-expert HF names (gate_proj, up_proj,
    down_proj); the model's gate_up_proj joins gate and up again (`fused.join_fused`)."""
    layer, kind = _FUSED_EXPERTS.match(key).groups()
    prefix = f"layers.{layer}.mlp.experts"
    e, h, i = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.intermediate_size
    if kind == "gate_up_proj":
        # transformers 5: [E, 2I, H], linear(x, W[e]).chunk(2) -> gate first; when 2I == H
        # the shape is ambiguous and this (the transformers 5) layout is taken.
        fused = _per_expert(tensor, key, (e, 2 * i, h))  # or the x @ W[e] form
        for x in range(e):
            out[f"{prefix}.{x}.gate_proj.weight"] = fused[x, :i]
            out[f"{prefix}.{x}.up_proj.weight"] = fused[x, i:]
    else:
        # transformers 5: linear(h, W[e]); preferred when H == I
        fused = _per_expert(tensor, key, (e, h, i))
        for x in range(e):
            out[f"{prefix}.{x}.down_proj.weight"] = fused[x]


def _layout(cfg: ModelConfig) -> tuple[dict[str, list[int]], Layout]:
    """Names and shapes of zkl's state dict for `cfg` with each fused tensor split into its
    parts (HF's names), and the fused layout; from the model itself (meta device)."""
    model = build_on_meta(cfg)
    layout = fused_layout(model)
    separate = split_fused(model.state_dict(), layout)
    return {k: list(v.shape) for k, v in separate.items()}, layout


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """zkl's state dict with q/k/v and gate/up split into HF's separate projections (views;
    no `model.` prefix): what an HF-format checkpoint of zkl's weights holds."""
    return split_fused(state, _layout(cfg)[1])


def _renamed(hf_key: str, renames: tuple[tuple[str, str], ...]) -> str:
    key = hf_key.removeprefix("model.")
    for old, new in renames:
        if key.startswith(old):
            key = new + key.removeprefix(old)
    return key


def _name_list(names: list[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_state_dict(
    path: str | Path, cfg: ModelConfig, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """All weights of the checkpoint under zkl's parameter names (q/k/v and gate/up fused),
    as fp32 tensors on `device`."""
    sd = map_state_dict(_read_tensors(Path(path), device), cfg, path)
    sd = {k: v.to(torch.float32).contiguous() for k, v in sd.items()}
    return join_fused(sd, _layout(cfg)[1])


def map_state_dict(
    raw: dict[str, torch.Tensor], cfg: ModelConfig, path: str | Path
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors under zkl's names with fused projections still split (HF's separate
    q/k/v and gate/up), every name and shape checked against `cfg`.

    Works on meta tensors too, so the checkpoint check runs it on the headers alone.
    """
    entry = family(cfg)
    renamed = [(_renamed(hf_key, entry.renames), hf_key, t) for hf_key, t in raw.items()]
    if entry.convert is not None and len({k for k, _, _ in renamed}) == len(renamed):
        # tensors stored in another form, rewritten under HF's separate names
        origin = {key: hf_key for key, hf_key, _ in renamed}
        kept = entry.convert({key: t for key, _, t in renamed}, cfg)
        renamed = [(key, origin.get(key, key), t) for key, t in kept.items()]
    sd: dict[str, torch.Tensor] = {}
    for key, hf_key, tensor in renamed:
        if _IGNORED.search(key):
            continue
        if cfg.is_moe and _FUSED_EXPERTS.match(key):
            parts: dict[str, torch.Tensor] = {}
            _unfuse_experts(key, tensor, cfg, parts)
            clash = set(parts) & set(sd)
            if clash:
                raise ValueError(
                    f"checkpoint has experts both fused (model.{key}) and per expert "
                    f"({_name_list(list(clash), 2)})."
                )
            sd.update(parts)
            continue
        if key in sd:
            raise ValueError(
                f"checkpoint tensor {hf_key!r} maps to {key!r}, which another tensor already "
                "gave (experts both fused and per expert, or keys with and without 'model.')."
            )
        sd[key] = tensor

    expected = _layout(cfg)[0]
    if cfg.tie_word_embeddings and "embed_tokens.weight" in sd:
        # HF ties lm_head to the embedding (any saved lm_head copy is the same tensor).
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    missing = set(expected) - set(sd)
    unexpected = set(sd) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {_name_list(list(missing))}")
        if unexpected:
            parts.append(f"unexpected keys: {_name_list(list(unexpected))}")
        raise ValueError(
            f"checkpoint {str(path)!r} does not match its {cfg.family} config ({'; '.join(parts)})."
        )
    bad = [
        f"{k}: checkpoint {_shape(sd[k])} vs config {expected[k]}"
        for k in sorted(expected)
        if _shape(sd[k]) != expected[k]
    ]
    if bad:
        raise ValueError(
            f"checkpoint {str(path)!r} tensor shapes do not match config.json: "
            + "; ".join(bad[:8])
            + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        )
    return sd
