"""The decode state of every slot, on the device: row s belongs to whichever request holds
slot s. A decode step reads and writes only these tensors (and the cache), so it runs
without Python per row, without a host read, and inside a CUDA graph."""

from __future__ import annotations

import torch

from zkl.generation.sampling import SamplingParams


class SlotState:
    """Per-slot decode state: next token, position, counts, outputs, sampling parameters."""

    def __init__(self, num_slots: int, max_new: int, device: torch.device):
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.token = zeros(num_slots)  # the next input token (the last sampled one)
        self.pos = zeros(num_slots)  # its position
        self.count = zeros(num_slots)  # tokens generated so far
        self.done = torch.ones(num_slots, dtype=torch.bool, device=device)
        self.seed = zeros(num_slots)
        self.max_new = zeros(num_slots)
        self.top_k = zeros(num_slots)
        self.temperature = zeros(num_slots, dtype=torch.float32)
        self.top_p = zeros(num_slots, dtype=torch.float32)
        self.out_tokens = zeros(num_slots, max_new)
        self.out_logprobs = zeros(num_slots, max_new, dtype=torch.float32)
        # the logprob under the filtered (top-k / top-p), renormalised distribution sampled from
        self.out_lp_sampled = zeros(num_slots, max_new, dtype=torch.float32)

    def admit(self, slots: torch.Tensor, params: list[SamplingParams], last_pos: list[int]):
        """Reset the rows of `slots` for new requests whose last prompt token is at `last_pos`."""
        device = slots.device

        def put(field: torch.Tensor, values: list) -> None:
            field[slots] = torch.tensor(values, dtype=field.dtype).to(device, non_blocking=True)

        put(self.pos, last_pos)
        put(self.count, [0] * len(params))
        put(self.done, [False] * len(params))
        put(self.seed, [p.seed for p in params])
        put(self.max_new, [p.max_new_tokens for p in params])
        put(self.top_k, [p.top_k for p in params])
        put(self.temperature, [p.temperature for p in params])
        put(self.top_p, [p.top_p for p in params])

    def record(self, rows: torch.Tensor, out: torch.Tensor, values: torch.Tensor) -> None:
        """values [B, ...] into output `out` [slots, max_new, ...] at each live row's next
        column (call before `ops.commit_samples` advances the count); device ops only."""
        live = ~self.done[rows]
        column = self.count[rows].clamp(max=out.shape[1] - 1)
        live = live.view(-1, *([1] * (values.dim() - 1)))
        out[rows, column] = torch.where(live, values.to(out.dtype), out[rows, column])
