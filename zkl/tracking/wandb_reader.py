"""Read a W&B offline run back from its `.wandb` transaction log, without the W&B service.

wandb >= 0.31 has no offline reader in its Python API, so this module parses the file itself.
Format (as written by wandb-core 0.31, checked against real files):

* File header, 7 bytes: ``b":W&B"`` then the magic ``0xBEE1`` as little-endian uint16
  (``e1 be``) then a version byte ``0`` -- ``struct.pack("<4sHB", b":W&B", 0xBEE1, 0)``.
* The rest is a LevelDB-style log of 32 KiB blocks. Block boundaries are at absolute file
  offsets that are multiples of 32768; the file header occupies the first 7 bytes of block 0.
* Each chunk has a 7-byte header ``struct.pack("<IHB", crc, length, type)`` followed by
  ``length`` payload bytes; a chunk never crosses a block boundary. Type is 1 FULL, 2 FIRST,
  3 MIDDLE, 4 LAST: a record is either one FULL chunk or FIRST, MIDDLE*, LAST.
* When fewer than 7 bytes are left in a block, they are zero padding.
* ``crc`` is plain (unmasked) CRC-32/IEEE (``zlib.crc32``) of the type byte followed by the
  payload, i.e. ``zlib.crc32(payload, zlib.crc32(bytes([type])))``.
* A reassembled record is a serialized ``wandb.proto.wandb_internal_pb2.Record``.

History rows are ``record.history.item`` entries. Each item names its key by ``key`` or by
``nested_key`` (a path; wandb-core writes every logged key as ``nested_key``, a logged nested
dict ``{"n": {"a": 1}}`` becomes the path ``["n", "a"]``, and a key with slashes such as
``"train/loss"`` is one path element). The value is ``value_json`` and, when the run used
``WANDB_X_HISTORY_VALUE_ENCODING=json,typed``, also a typed scalar that keeps the Python type
(the JSON form writes a logged ``2.0`` as ``2``, which decodes to ``int``; equal by ``==``).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from zkl.console import say

if TYPE_CHECKING:
    from wandb.proto.wandb_internal_pb2 import Record

FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
FILE_VERSION = 0
FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version: 7 bytes

BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, payload length, chunk type: 7 bytes

CHUNK_FULL = 1
CHUNK_FIRST = 2
CHUNK_MIDDLE = 3
CHUNK_LAST = 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (CHUNK_FULL, CHUNK_FIRST, CHUNK_MIDDLE, CHUNK_LAST)}

INTERNAL_KEY = "_wandb"  # wandb's own bookkeeping entry in config and summary


class TruncatedLogError(ValueError):
    """The file ends inside a chunk or a fragmented record (e.g. a run still being written).

    wandb-core writes the log in whole 32 KiB blocks while a run is live, so a live file often
    ends mid-record; pass ``allow_truncated=True`` to read the complete records before that.
    """


def find_offline_run_file(wandb_dir: str | Path) -> Path:
    """Return the single ``offline-run-*/run-*.wandb`` file under ``wandb_dir``.

    ``wandb_dir`` may be the directory passed as ``wandb.init(dir=...)`` (it contains a
    ``wandb/`` folder), that ``wandb/`` folder itself, one ``offline-run-*`` folder, or the
    ``.wandb`` file. Raises ValueError when there is no such file or more than one.
    """
    path = Path(wandb_dir)
    if path.is_file():
        if path.suffix != ".wandb":
            raise ValueError(f"{path} is not a .wandb file")
        return path
    if not path.is_dir():
        raise ValueError(f"{path} does not exist")
    base = path / "wandb" if (path / "wandb").is_dir() else path
    found = sorted(base.glob("offline-run-*/run-*.wandb")) or sorted(path.glob("run-*.wandb"))
    if not found:
        raise ValueError(f"no offline-run-*/run-*.wandb file under {base}")
    if len(found) > 1:
        listing = ", ".join(str(p) for p in found)
        raise ValueError(f"{len(found)} offline runs under {base}, expected one: {listing}")
    return found[0]


def _resolve(path: str | Path) -> Path:
    path = Path(path)
    return find_offline_run_file(path) if path.is_dir() else path


def _iter_payloads(f: BinaryIO, name: str) -> Iterator[bytes]:
    """Yield the reassembled record payloads of an open `.wandb` file."""
    header = f.read(FILE_HEADER.size)
    if len(header) != FILE_HEADER.size:
        raise ValueError(f"{name}: too short for the {FILE_HEADER.size}-byte W&B file header")
    ident, magic, version = FILE_HEADER.unpack(header)
    if ident != FILE_IDENT or magic != FILE_MAGIC:
        raise ValueError(f"{name}: not a W&B transaction log (header {header!r})")
    if version != FILE_VERSION:
        raise ValueError(f"{name}: unsupported W&B log version {version}")

    offset = FILE_HEADER.size
    fragments: list[bytes] | None = None  # set while inside a FIRST..LAST record
    while True:
        left = BLOCK_SIZE - offset % BLOCK_SIZE
        if left < CHUNK_HEADER.size:  # block trailer: zero padding, possibly cut by EOF
            pad = f.read(left)
            if pad.strip(b"\0"):
                raise ValueError(f"{name}: non-zero block padding at offset {offset}")
            offset += len(pad)
            if len(pad) < left:
                break
            continue
        head = f.read(CHUNK_HEADER.size)
        if not head:
            break
        if len(head) != CHUNK_HEADER.size:
            raise TruncatedLogError(f"{name}: file ends inside a chunk header at offset {offset}")
        crc, length, chunk_type = CHUNK_HEADER.unpack(head)
        if CHUNK_HEADER.size + length > left:
            raise ValueError(
                f"{name}: chunk at offset {offset} ({length} bytes) crosses a block boundary"
            )
        payload = f.read(length)
        if len(payload) != length:
            raise TruncatedLogError(
                f"{name}: file ends inside the chunk at offset {offset}"
                f" ({len(payload)} of {length} payload bytes)"
            )
        if chunk_type not in _TYPE_CRC:
            raise ValueError(f"{name}: unknown chunk type {chunk_type} at offset {offset}")
        if zlib.crc32(payload, _TYPE_CRC[chunk_type]) != crc:
            raise ValueError(f"{name}: checksum mismatch in chunk at offset {offset}")
        if (chunk_type in (CHUNK_FULL, CHUNK_FIRST)) != (fragments is None):
            raise ValueError(f"{name}: unexpected chunk type {chunk_type} at offset {offset}")
        offset += CHUNK_HEADER.size + length

        if chunk_type == CHUNK_FULL:
            yield payload
        elif chunk_type == CHUNK_FIRST:
            fragments = [payload]
        elif chunk_type == CHUNK_MIDDLE:
            fragments.append(payload)
        else:
            fragments.append(payload)
            yield b"".join(fragments)
            fragments = None
    if fragments is not None:
        raise TruncatedLogError(f"{name}: file ends inside a fragmented record at offset {offset}")


def read_records(path: str | Path, *, allow_truncated: bool = False) -> Iterator[Record]:
    """Yield every ``wandb_internal_pb2.Record`` of a `.wandb` file, in file order.

    ``path`` is the `.wandb` file or a directory accepted by `find_offline_run_file`. Each
    chunk's CRC is verified; a bad header, checksum, chunk layout, protobuf payload or a
    truncated file raises ValueError during iteration (truncation as its subclass
    `TruncatedLogError`). With ``allow_truncated=True`` an incomplete record at the end of the
    file (a run still being written, or killed mid-write) ends the iteration silently instead;
    corruption still raises.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto.wandb_internal_pb2 import Record

    path = _resolve(path)
    with open(path, "rb") as f:
        try:
            for payload in _iter_payloads(f, str(path)):
                record = Record()
                try:
                    record.ParseFromString(payload)
                except DecodeError as e:
                    raise ValueError(f"{path}: undecodable record: {e}") from e
                yield record
        except TruncatedLogError:
            if not allow_truncated:
                raise


def _item_path(item: Any) -> tuple[str, ...]:
    """The key path of a history/config/summary item (``nested_key`` wins over ``key``)."""
    if item.nested_key:
        return tuple(item.nested_key)
    return (item.key,)


def _decode_json(text: str, path: tuple[str, ...]) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"bad value_json for key {'.'.join(path)!r}: {text!r}") from e


def _item_value(item: Any) -> Any:
    """Decode an item: the typed scalar when present (HistoryItem only), else value_json."""
    typed = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    if typed == "none":
        return None
    if typed == "json":
        return _decode_json(item.json, _item_path(item))
    if typed is not None:  # boolean, integer, number, text
        return getattr(item, typed)
    return _decode_json(item.value_json, _item_path(item))


def _set_path(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = target[part] = {}
        target = child
    target[path[-1]] = value


def _del_path(target: dict[str, Any], path: tuple[str, ...]) -> None:
    for part in path[:-1]:
        target = target.get(part)
        if not isinstance(target, dict):
            return
    target.pop(path[-1], None)


def read_history(path: str | Path, *, allow_truncated: bool = False) -> list[dict[str, Any]]:
    """One dict per logged step (history record), in file order, including ``_step``.

    Keys are the logged keys (``"train/loss"`` stays one key); a logged nested dict comes
    back nested. Values are decoded JSON (NaN/Infinity become floats). ``_runtime`` and
    ``_timestamp`` added by wandb are kept.
    """
    rows = []
    for record in read_records(path, allow_truncated=allow_truncated):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            _set_path(row, _item_path(item), _item_value(item))
        row.setdefault("_step", record.history.step.num)
        rows.append(row)
    return rows


def read_config(
    path: str | Path, *, include_internal: bool = False, allow_truncated: bool = False
) -> dict[str, Any]:
    """The run config: the ``run`` record's config, then later config updates and removals.

    The ``_wandb`` bookkeeping entry is dropped unless ``include_internal``.
    """
    config: dict[str, Any] = {}
    for record in read_records(path, allow_truncated=allow_truncated):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            updates, removes = record.run.config.update, record.run.config.remove
        elif kind == "config":
            updates, removes = record.config.update, record.config.remove
        else:
            continue
        for item in updates:
            _set_path(config, _item_path(item), _item_value(item))
        for item in removes:
            _del_path(config, _item_path(item))
    if not include_internal:
        config.pop(INTERNAL_KEY, None)
    return config


def read_summary(
    path: str | Path, *, include_internal: bool = False, allow_truncated: bool = False
) -> dict[str, Any]:
    """The final run summary: all summary updates and removals applied in file order.

    ``_runtime`` is whatever wandb-core wrote last (its own runtime records write whole seconds,
    so it can be 0 for a short run). The ``_wandb`` bookkeeping entry is dropped unless
    ``include_internal``.
    """
    summary: dict[str, Any] = {}
    for record in read_records(path, allow_truncated=allow_truncated):
        if record.WhichOneof("record_type") != "summary":
            continue
        for item in record.summary.update:
            _set_path(summary, _item_path(item), _item_value(item))
        for item in record.summary.remove:
            _del_path(summary, _item_path(item))
    if not include_internal:
        summary.pop(INTERNAL_KEY, None)
    return summary


def read_run_info(path: str | Path, *, allow_truncated: bool = False) -> dict[str, Any]:
    """Run metadata from the ``run`` record(s) and the ``exit`` record.

    Keys: id, entity, project, name, group, job_type, tags, notes, start_time (epoch
    seconds), exit_code (None when the log has no exit record, e.g. the run crashed).
    """
    info: dict[str, Any] = {"exit_code": None}
    for record in read_records(path, allow_truncated=allow_truncated):
        kind = record.WhichOneof("record_type")
        if kind == "exit":
            info["exit_code"] = record.exit.exit_code
        elif kind == "run":
            run = record.run
            fields = {
                "id": run.run_id,
                "entity": run.entity,
                "project": run.project,
                "name": run.display_name,
                "group": run.run_group,
                "job_type": run.job_type,
                "tags": list(run.tags),
                "notes": run.notes,
                "start_time": run.start_time.seconds + run.start_time.nanos * 1e-9
                if run.HasField("start_time")
                else None,
            }
            # Later run records (e.g. a rename) only override what they set.
            info.update({k: v for k, v in fields.items() if v or k not in info})
    return info


def summarize(path: str | Path) -> str:
    """What `python -m zkl.tracking.wandb_reader DIR` prints: the run, its steps, last values."""
    if not Path(path).exists():
        raise ValueError(f"{path} does not exist; pass a run directory or a .wandb file")
    run_file = _resolve(path)
    info = read_run_info(run_file, allow_truncated=True)
    history = read_history(run_file, allow_truncated=True)
    lines = [
        f"{run_file}",
        f"run {info.get('id')} project={info.get('project')} group={info.get('group')} "
        f"exit_code={info.get('exit_code')}",
        f"{len(history)} history rows",
    ]
    if history:
        last = history[-1]
        keys = [k for k in last if k.startswith("train/")] or list(last)[:12]
        lines += [f"last row (step {last.get('_step', last.get('step'))}):"]
        lines += [f"  {k} = {last[k]}" for k in keys]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print a summary of one offline run; exit 2 with a usage sentence on a bad argument."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        say(
            "usage: python -m zkl.tracking.wandb_reader RUN_DIR (a run directory, its wandb/ "
            "folder, an offline-run-* folder or a .wandb file): prints the run's id, group, "
            "history length and last row."
        )
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        print(summarize(args[0]))
    except (ValueError, OSError) as err:
        say(f"zkl.tracking.wandb_reader: {err}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
