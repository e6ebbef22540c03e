"""A bad `model.checkpoint` or dataset input is refused by the check phase of every entry
point, before torch is imported, and each refusal names the key the user set (a value that
defaults from another key is named by that key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from zkl.data.config import TaskConfig, tokenizer_source
from zkl.data.dataset import check_inputs
from zkl.errors import ConfigError
from zkl.models.config import ModelConfig, check_positions
from zkl.precision.config import PrecisionConfig
from zkl.precision.config import check as check_precision

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "helpers" / "torch_probe.py"
TRAIN = REPO / "tests" / "testdata" / "arith_train.jsonl"
MARK = "torch_probe: torch imported="


def weights(directory: Path) -> Path:
    """A checkpoint's files as the check phase sees them: config.json and one whole safetensors
    file (no tokenizer). What its config.json says is read later, with torch."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    tensors = {"model.norm.weight": np.ones(64, np.float32), "lm_head.weight": np.ones((8, 64))}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def with_tokenizer(directory: Path) -> Path:
    """`weights` and a tokenizer (three words, EOS named) beside them."""
    from tokenizers import Tokenizer, models

    weights(directory)
    vocab = {"<eos>": 0, "[UNK]": 1, "1": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return directory


def truncated(directory: Path) -> Path:
    file = weights(directory) / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 100])
    return directory


def probe(module: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`python -m module args` through the probe; a Hydra entry point runs in tmp_path/run."""
    if module != "zkl.lab.warm_start":
        args = [*args, f"hydra.run.dir={tmp_path / 'run'}"]
    else:
        args = [str(tmp_path / "out"), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(PROBE), module, *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


# (entry point, the command line's overrides from tmp_path, words of the one line)
CASES = [
    ("zkl", lambda t: [f"model.checkpoint={t / 'missing'}"], "missing does not exist"),
    ("zkl.cert", lambda t: [f"model.checkpoint={truncated(t / 'c')}"], "is truncated: tensor"),
    ("zkl.bench", lambda t: [f"model.checkpoint={t / 'missing'}"], "missing does not exist"),
    (
        "zkl.lab.warm_start",
        lambda t: [f"model.checkpoint={truncated(t / 'c')}"],
        "model.safetensors is truncated",
    ),
    (
        "zkl.bench",
        lambda t: ["task=dataset", f"task.path={t / 'none.jsonl'}"],
        "task.path=",
    ),
    (
        "zkl",
        lambda t: [f"model.checkpoint={weights(t / 'c')}", "task=dataset", f"task.path={TRAIN}"],
        "(task.tokenizer's default) has no tokenizer.json",
    ),
    (
        "zkl.cert",
        lambda t: [f"task.tokenizer={t}", "task=dataset", f"task.path={TRAIN}"],
        "has no tokenizer.json",
    ),
    (
        "zkl.lab.warm_start",
        lambda t: [
            f"model.checkpoint={with_tokenizer(t / 'c')}",
            "task=dataset",
            f"task.path={TRAIN}",
            "task.reward=nope.mod:f",
        ],
        "task.reward=nope.mod:f: module 'nope.mod' cannot be imported",
    ),
]


@pytest.mark.parametrize("module, overrides, words", CASES, ids=[c[0] for c in CASES])
def test_checkpoint_and_dataset_refusals_come_before_torch(module, overrides, words, tmp_path):
    out = probe(module, overrides(tmp_path), tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in out.stderr, lines
    assert lines[0].startswith(f"{module}: ") and words in lines[0], lines[0]
    assert f"{MARK}False" in out.stdout, (lines[0], out.stdout[-500:])


def test_a_defaulted_tokenizer_is_named_by_model_checkpoint(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    named = f"model.checkpoint={ckpt} (task.tokenizer's default)"
    dataset = TaskConfig(name="dataset", path=str(TRAIN))
    assert tokenizer_source(dataset, ckpt) == (ckpt, named)
    filled = TaskConfig(name="dataset", path=str(TRAIN), tokenizer=ckpt)  # as run configs hold
    assert tokenizer_source(filled, ckpt) == (ckpt, named)
    other = TaskConfig(name="dataset", path=str(TRAIN), tokenizer=str(tmp_path))
    assert tokenizer_source(other, ckpt) == (str(tmp_path), f"task.tokenizer={tmp_path}")
    assert tokenizer_source(dataset, None) == (None, "task.tokenizer")
    with pytest.raises(ConfigError) as err:
        check_inputs(dataset, weights(Path(ckpt)))
    assert str(err.value).startswith(f"{named} has no tokenizer.json")
    assert "task.tokenizer=" not in str(err.value)


def test_a_size_the_checkpoint_set_is_named_by_model_checkpoint():
    """Positions and MXFP8 widths read from config.json: the refusal names model.checkpoint
    and does not ask to raise a key the checkpoint fixes."""
    mine, theirs = ModelConfig(max_position_embeddings=8), ModelConfig(checkpoint="/w")
    theirs.max_position_embeddings = 8
    with pytest.raises(ConfigError, match="raise it"):
        check_positions(mine, 10, "a prompt needs")
    with pytest.raises(ConfigError) as err:
        check_positions(theirs, 10, "a prompt needs")
    assert "model.checkpoint=/w" in str(err.value) and "raise it" not in str(err.value)
    mx = PrecisionConfig(name="mxfp8", linear_quant="mxfp8")
    theirs.hidden_size = mine.hidden_size = 48
    with pytest.raises(ConfigError) as err:
        check_precision(mx, theirs)
    assert "model.hidden_size (from model.checkpoint=/w's config.json)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_precision(mx, mine)
    assert "model.checkpoint" not in str(err.value)
