"""checkpoint.pt on disk: written atomically with a digest of its contents, read back verified.

torch does not check the CRCs of its zip archive, so flipped bits in a tensor load silently
and a resumed run computes another history. The digest is a sha256 over every value of the
state in order (each tensor's dtype, shape and raw bytes; every number, string and container
tagged with its type), stored in the state itself. A file that cannot be read, fails its
digest, lacks a field, holds one of the wrong type, or a step or weight version out of range
is one sentence naming the file and the way out; a resume never starts on it.

A save that fails (disk full, I/O error) removes its temporary file and stops the run with
one sentence (exit 1); the previous checkpoint and every logged step stay as they were.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch

from zkl.errors import ConfigError, RunFault

FORMAT = 2  # 2: with `digest`
DIGEST_KEY = "digest"
# field -> its type(s); `int` fields refuse bools
FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "step": (int,),
    "policy": (dict,),
    "rng": (dict,),
    "wandb_id": (str, type(None)),
    "config": (dict,),
    "requeue": (bool,),
    DIGEST_KEY: (str,),
}
POLICY_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (dict,),
    "masters": (list, type(None)),
    "optimizer": (dict,),
    "version": (int,),
}
# a sharded run's checkpoint.pt (zkl/state/sharded.py): the shards are files of
# their own, each rank's digest of its shards is kept here and checked after loading them
SHARDED_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,),
    "step": (int,),
    "shards": (str,),
    "version": (int,),
    "world_size": (int,),
    "rng": (list,),
    "shard_digests": (list,),
    "wandb_id": (str, type(None)),
    "config": (dict,),
    "requeue": (bool,),
    DIGEST_KEY: (str,),
}
SHARDS_NAME = re.compile(r"checkpoint_shards/step_\d{6}")
RNG_FIELDS: dict[str, tuple[type, ...]] = {
    "torch": (torch.Tensor,),
    "python": (tuple,),
    "cuda": (list, type(None)),
}


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():  # the tensor's own bytes, no copy: a uint8 view, as numpy's buffer
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        h.update(b"D%d" % len(value))
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, (list, tuple)):
        h.update((b"L%d" if isinstance(value, list) else b"U%d") % len(value))
        for item in value:
            _feed(h, item)
    elif isinstance(value, bool):  # before int: True is an int
        h.update(b"B1" if value else b"B0")
    elif isinstance(value, int):
        h.update(b"I%d;" % value)
    elif isinstance(value, float):
        h.update(b"F" + value.hex().encode() + b";")
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"S%d:" % len(data) + data)
    elif isinstance(value, bytes):
        h.update(b"Y%d:" % len(value) + value)
    elif value is None:
        h.update(b"N")
    elif isinstance(value, (torch.dtype, torch.device, torch.Size)):
        h.update(b"O" + str(value).encode() + b";")
    else:
        raise TypeError(f"a checkpoint cannot hold a {type(value).__name__}")


def digest(state: dict[str, Any]) -> str:
    """sha256 over every value of `state` except its digest, in order."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != DIGEST_KEY})
    return h.hexdigest()


def write(path: Path, state: dict[str, Any]) -> None:
    """`state` with its digest, to `path` atomically: temporary file, fsync, rename.

    Any failure removes the temporary file and raises RunFault; `path` is untouched.
    """
    state = {**state, "format": FORMAT}
    state[DIGEST_KEY] = digest(state)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch reports a failed write as RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        why = (why.strip().splitlines() or [type(err).__name__])[-1][:200]
        kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} is kept"
        raise RunFault(
            f"cannot save {path} ({why}); {kept}, with every logged step; free space on that "
            "disk and rerun with resume=true."
        ) from None


def _check_fields(where: str, tree: Any, fields: dict[str, tuple[type, ...]]) -> str | None:
    if not isinstance(tree, dict):
        return f"{where} is a {type(tree).__name__}, not a dict"
    for name, types in fields.items():
        if name not in tree:
            return f"it has no {where}{name!r} field"
        value = tree[name]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            wanted = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            return f"its {where}{name!r} is a {type(value).__name__}, not {wanted}"
    return None


def _problem(path: Path, max_step: int) -> tuple[str, dict[str, Any] | None]:
    """Why `path` cannot be resumed from ('' when it can), and its state."""
    try:
        info = os.stat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})", None
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the reader forever
        return "is not a regular file", None
    if info.st_size == 0:
        return "is empty", None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip, pickle, storage errors: the file is not a checkpoint
        first = (str(err).strip().splitlines() or [""])[0][:160]
        return f"cannot be read as a checkpoint ({type(err).__name__}: {first})", None
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a checkpoint", None
    if "format" in state and state["format"] != FORMAT:
        return f"has checkpoint format {state['format']!r}, not {FORMAT} (another zkl)", None
    if "shards" in state:
        problem = _check_fields("", state, SHARDED_FIELDS) or _sharded_problem(state)
    else:
        problem = _check_fields("", state, FIELDS)
        problem = problem or _check_fields("policy.", state["policy"], POLICY_FIELDS)
        problem = problem or _check_fields("rng.", state["rng"], RNG_FIELDS)
    if problem:
        return problem, None
    try:
        actual = digest(state)
    except TypeError as err:
        return f"holds an unexpected value ({err})", None
    if actual != state[DIGEST_KEY]:
        return "does not match its digest (its contents were damaged)", None
    step = state["step"]
    version = state["version"] if "shards" in state else state["policy"]["version"]
    if step < 1:
        return f"has step {step}, not a step a run saves after (1 or more)", None
    if step > max_step:
        return f"has step {step}, beyond rl.steps={max_step} (set rl.steps >= {step})", None
    if version != step:
        return f"has weight version {version}, not its step {step}", None
    return "", state


def _sharded_problem(state: dict[str, Any]) -> str | None:
    """What is wrong with a sharded checkpoint's own fields (None when nothing is)."""
    if not SHARDS_NAME.fullmatch(state["shards"]):  # never a path out of the run directory
        return f"names shards {state['shards']!r}, not checkpoint_shards/step_NNNNNN"
    size = state["world_size"]
    if isinstance(size, bool) or size < 1:
        return f"has world_size {size!r}, not 1 or more"
    for name in ("rng", "shard_digests"):
        if len(state[name]) != size:
            return f"has {len(state[name])} {name} entries for world_size {size}"
    if not all(isinstance(d, str) for d in state["shard_digests"]):
        return "has a shard digest that is not a string"
    return None


def read(path: str | Path, max_step: int) -> dict[str, Any]:
    """The verified state in `path`, or ConfigError: one sentence with the way out."""
    path = Path(path)
    problem, state = _problem(path, max_step)
    if problem:
        raise ConfigError(
            f"{path} {problem}; delete it to rerun from step 0 with resume=true, or start "
            "afresh without resume=true in another hydra.run.dir."
        )
    assert state is not None
    return state
