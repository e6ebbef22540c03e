"""Decode captured in CUDA graphs, one graph per batch-size bucket.

A decode step of a dense model is a few hundred small kernels; launching them from Python
costs more than running them at small batches. Each bucket's step is captured once and
replayed. A graph bakes in the addresses of everything it touches, so the KV cache, the
slot state, the weights and the row index buffer are static: the cache and state live as
long as the captured graphs, refits copy weights in place (`load_refit`), and the rows of
a step go into the bucket's own index buffer before the replay.

Padding: a bucket larger than the running batch is filled with free slots. A free slot is
marked done, so sampling leaves its state untouched, and its KV rows belong to no request
(a new request's prefill rewrites every position it will read). With the fixes on, a real
row's result cannot depend on the padding rows (batch invariance; the tests check it with
`torch.equal`); with them off, padding changes the batch the way any batch change does.

Only models whose decode has no host sync are captured: MoE layers under a quantizing
recipe or an engine whose MoE is not `moe_graphs` (megatron-core's: `zkl.engines`) run one
call per expert (or a host-sized token dispatch), so they decode eagerly
(`scheduler.cuda_graphs=auto` says why in the log; `on` is refused by the config check, from
the same rule: `graph_unsupported_reason` reads the model's config, not the built model).
MoE layers otherwise group and run their experts on the device (`zkl.models.moe`), and
Mamba layers commit their chunk state on the device (`zkl.ops.ssd`): both are captured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch

from zkl.engines import NATIVE, engine_named
from zkl.generation.config import GRAPH_SETTINGS, graph_setting
from zkl.ops.fast import static_shapes

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

log = logging.getLogger(__name__)


def buckets_for(max_batch_size: int) -> tuple[int, ...]:
    """The bucket sizes of a scheduler: the standard ones below `max_batch_size`, then it."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
    return tuple(b for b in BUCKETS if b < max_batch_size) + (max_batch_size,)


def bucket_for(num_rows: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `num_rows` rows."""
    for size in buckets:
        if size >= num_rows:
            return size
    raise ValueError(f"{num_rows} rows do not fit the largest bucket {buckets[-1]}")


def padded_rows(running: list[int], free: list[int], size: int) -> list[int]:
    """The running slots, then the lowest free slots as padding, `size` rows in all."""
    pad = size - len(running)
    if pad < 0 or pad > len(free):
        raise ValueError(f"cannot pad {len(running)} rows to {size} with {len(free)} free slots")
    return list(running) + sorted(free)[:pad]


def graph_unsupported_reason(
    model: Any, device: torch.device, quantized: bool = False, engine: str = NATIVE.name
) -> str | None:
    """None when the decode step of a model with config `model` (a ModelConfig) on `device`
    can be captured, else why not (one sentence); `quantized`: a precision recipe quantizes
    the Linear layers (`precision.linear_quant`); `engine`: `engine.name`. The one rule:
    the config check refuses `scheduler.cuda_graphs=on` with it before any model is built, the
    scheduler decides with it."""
    layers = range(model.num_hidden_layers)
    moe = any(model.layer_is_moe(i) for i in layers)
    if moe and not engine_named(engine).moe_graphs:
        return f"the MoE layers of engine.name={engine} read the expert group sizes on the host"
    if quantized and moe:
        return (
            "MoE layers under a quantizing precision recipe run one call per expert, reading "
            "the expert group sizes on the host"
        )
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device and the model is on {device}"
    return None


def graphs_on(
    setting: object,
    model: Any,
    device: torch.device,
    quantized: bool = False,
    engine: str = NATIVE.name,
) -> bool:
    """Whether decode runs in CUDA graphs under `scheduler.cuda_graphs=setting` for a model
    with config `model` on `device`: auto where the decode can be captured, on or ValueError,
    off."""
    setting = graph_setting(setting)
    if setting not in GRAPH_SETTINGS:
        raise ValueError(f"scheduler.cuda_graphs={setting!r} must be auto, on or off.")
    if setting == "off":
        return False
    reason = graph_unsupported_reason(model, device, quantized, engine)
    if reason is None:
        return True
    if setting == "on":
        raise ValueError(
            f"scheduler.cuda_graphs=on cannot work here: {reason}; use "
            "scheduler.cuda_graphs=auto or off."
        )
    if device.type == "cuda":
        log.info("scheduler.cuda_graphs=auto: decode runs without graphs: %s", reason)
    return False


class BucketedDecode:
    """Decode steps padded to batch-size buckets, captured as CUDA graphs when `capture`.

    The step is the scheduler's device-only decode step over the slot rows [B] of the static
    cache and state (`decode.decode_one_token` bound to them), given to `prepare`. Without
    capture (the CPU tests) the same padding runs eagerly, so the padding logic is tested
    where there is no GPU.
    """

    def __init__(self, max_batch_size: int, capture: bool):
        self.step: Callable[[torch.Tensor], None] | None = None
        self.buckets = buckets_for(max_batch_size)
        self.capture = capture
        self.key: Hashable | None = None  # what the captured graphs baked in
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.rows: dict[int, torch.Tensor] = {}  # each bucket's static index buffer [size]
        self.captures = 0  # how many times the graphs were (re)captured
        self.padding_rows = 0  # padding rows run so far (a test checks padding happened)

    def prepare(
        self, step: Callable[[torch.Tensor], None], key: Hashable, device: torch.device
    ) -> None:
        """Capture `step` for every bucket unless the graphs were captured under the same
        `key` (then the step they baked in reads the same buffers: replay them).

        Call only while every slot is free (marked done): the warm-up runs real steps on
        slots 0..size-1, which must not advance any request.
        """
        self.step = step
        if key == self.key and (self.graphs or not self.capture):
            return
        self.graphs.clear()
        self.rows = {
            size: torch.arange(size, dtype=torch.int64, device=device) for size in self.buckets
        }
        self.key = key
        if not self.capture:
            return
        pool = None
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), static_shapes():
            for size in self.buckets:  # compile and warm up every kernel outside capture
                for _ in range(2):
                    self.step(self.rows[size])
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        with static_shapes():  # the very kernels (and shapes) the warm-up ran
            for size in reversed(self.buckets):  # largest first: the smaller reuse its pool
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.step(self.rows[size])
                pool = graph.pool()
                self.graphs[size] = graph
        torch.cuda.synchronize(device)
        self.captures += 1

    def drop(self) -> None:
        """Forget the graphs (their baked-in tensors are stale); the next prepare recaptures."""
        self.graphs.clear()
        self.key = None

    def load(self, running: list[int], free: list[int]) -> int:
        """Put the running slots, padded with free ones, in their bucket's buffer; its size."""
        size = bucket_for(len(running), self.buckets)
        self.padding_rows += size - len(running)
        rows = torch.tensor(padded_rows(running, free, size), dtype=torch.int64)
        self.rows[size].copy_(rows, non_blocking=False)
        return size

    def run(self, size: int) -> None:
        """One decode step of the rows loaded for bucket `size`."""
        if self.capture:
            self.graphs[size].replay()
        else:
            self.step(self.rows[size])
