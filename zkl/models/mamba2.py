"""Mamba2 mixer (Nemotron-H's): in-projection, causal depthwise conv, SSD scan, gated norm.

The SSD scan cuts the sequence into chunks at absolute positions that are multiples of
`chunk_size`, so the train forward of prompt+response and the prefill of the prompt cut at
the same places. Every reduction is an elementwise product followed by `ordered_sum` (a
fixed pairwise tree) over a dimension whose size is fixed by the config, so a row's result
never depends on the batch, the number of chunks or the rows computed beside it.

On the gen path the cache holds, per slot, the conv inputs of the last `conv_kernel - 1`
positions and an fp32 SSM state. With `mamba_chunked_decode` the state is the one at the
last chunk boundary and the cache also buffers the current partial chunk; prefill and
decode both run the chunk scan over (buffer + new tokens) from that state, so decode makes
the same bits as training and the state is committed when a chunk fills. With the fix off,
the state is the running state, kept in the model dtype (what vLLM's default
`mamba_ssm_cache_dtype=auto` does), and decode is the ordinary one-step recurrence.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zkl import ops
from zkl.invariance import is_enabled
from zkl.models.config import ModelConfig
from zkl.models.transformer import Linear
from zkl.ops import ssd
from zkl.ops.activations import silu, softplus
from zkl.ops.invariant import ordered_sum


def _cumulative(a: torch.Tensor) -> torch.Tensor:
    """a [b, n, Q, H] -> running sums over Q, added in position order."""
    sums = [a[:, :, 0]]
    for i in range(1, a.shape[2]):
        sums.append(sums[-1] + a[:, :, i])
    return torch.stack(sums, dim=2)


def _intra(C_rows, cum_rows, visible, B, cum, xdt) -> torch.Tensor:
    """Diagonal block: y[l] = sum_{s<=l} (C[l].B[s]) exp(cum[l]-cum[s]) x[s]dt[s].

    C_rows [b, n, l, H, N] and cum_rows [b, n, l, H] are the rows wanted (all of the chunk
    on the train path, one on decode); visible broadcasts to [b, n, l, s, H]. Every value
    is elementwise or a fixed tree over s / N, so a row's bits do not depend on which other
    rows are computed.
    """
    # Mask the exponent, not the result: above the diagonal cum[l] - cum[s] grows with the
    # chunk (about 166 at Nemotron-H's 128) and exp overflows; where's backward would then
    # multiply a zero by that inf and poison every gradient with NaN. exp(-inf) is 0, so the
    # visible entries keep their bits.
    gap = cum_rows.unsqueeze(3) - cum.unsqueeze(2)  # [b, n, l, s, H]
    decay = torch.exp(torch.where(visible, gap, torch.full_like(gap, -math.inf)))
    scores = ordered_sum(C_rows.unsqueeze(3) * B.unsqueeze(2)) * decay  # [b, n, l, s, H]
    return ordered_sum(scores.unsqueeze(-1) * xdt.unsqueeze(2), dim=3)  # [b, n, l, H, P]


# The diagonal blocks' products [chunks, Q, Q, H, max(N, P)] are built this many fp32 values
# at a time at most (1 GiB), whatever the batch and the sequence length.
SCAN_PIECE_VALUES = 1 << 28


def scan_piece_chunks(chunk: int, heads: int, width: int) -> int:
    """How many chunks the train path's diagonal blocks take at once (at least one)."""
    return max(1, SCAN_PIECE_VALUES // (chunk * chunk * heads * width))


def _diagonal(Cc, cum, Bc, xdt, causal) -> torch.Tensor:
    """`_intra` over every chunk of the batch, `scan_piece_chunks` chunks at a time.

    Each chunk's diagonal block is elementwise work and fixed trees within the chunk, so
    taking the (batch, chunk) pairs a few at a time leaves every value's bits as they are and
    bounds the transient products (and their gradients) instead of growing them with
    batch x length.
    """
    b, n, Q, H, N = Cc.shape
    step = scan_piece_chunks(Q, H, max(N, xdt.shape[-1]))
    if b * n <= step:
        return _intra(Cc, cum, causal, Bc, cum, xdt)

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b * n, 1, *t.shape[2:])

    pieces = zip(*(flat(t).split(step) for t in (Cc, cum, Bc, xdt)))
    y = [_intra(c, k, causal, bb, k, x) for c, k, bb, x in pieces]
    return torch.cat(y).view(b, n, Q, H, -1)


def _off(C_rows, cum_rows, start) -> torch.Tensor:
    """The state entering the chunk [b, n, H, P, N], read out by C and decayed to each row."""
    return ordered_sum(C_rows.unsqueeze(-2) * start.unsqueeze(2)) * torch.exp(cum_rows)[..., None]


def _chunks(x, dt, B, C, A, chunk):
    b, length, H, P = x.shape
    n = length // chunk
    cum = _cumulative((dt * A).view(b, n, chunk, H))  # [b, n, Q, H]
    xdt = x.view(b, n, chunk, H, P) * dt.view(b, n, chunk, H, 1)
    return cum, xdt, B.view(b, n, chunk, H, -1), C.view(b, n, chunk, H, -1)


def chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD over whole chunks, fp32: y [b, n*Q, H, P] and the states at every boundary.

    x [b, n*Q, H, P], dt [b, n*Q, H] (0 on padding), B, C [b, n*Q, H, N], A [H],
    h0 [b, H, P, N] the state at the first boundary. Returns states [b, n+1, H, P, N].
    """
    b, length, H, P = x.shape
    n = length // chunk
    cum, xdt, Bc, Cc = _chunks(x, dt, B, C, A, chunk)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()[:, :, None]
    y_diag = _diagonal(Cc, cum, Bc, xdt, causal)
    states = [h0]
    for c in range(n):  # inter-chunk recurrence, one boundary at a time
        part = slice(c, c + 1)
        states.append(ssd.commit(states[-1], Bc[:, part], cum[:, part], xdt[:, part]))
    states = torch.stack(states, dim=1)  # [b, n+1, H, P, N]
    y_off = _off(Cc, cum, states[:, :n])
    return (y_diag + y_off).reshape(b, length, H, P), states


def chunk_row(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    row: torch.Tensor,
) -> torch.Tensor:
    """Decode form of `chunk_scan` for one chunk: only row `row` [b] of each batch row.

    The same pieces as the train path on the same values, so the row's bits are the
    train path's. Returns y [b, H, P]; the state of each row whose chunk is full (row == Q-1)
    moves to the chunk's end in place (`state[slots]`, [S, H, P, N]), on the device.
    """
    b, chunk, H, P = x.shape
    cum, xdt, Bc, Cc = _chunks(x, dt, B, C, A, chunk)
    pick = torch.arange(b, device=x.device)
    C_row = Cc[pick, :, row].unsqueeze(2)  # [b, 1, 1, H, N]
    cum_row = cum[pick, :, row].unsqueeze(2)  # [b, 1, 1, H]
    visible = torch.arange(chunk, device=x.device) <= row[:, None]  # [b, s]
    y = _intra(C_row, cum_row, visible[:, None, None, :, None], Bc, cum, xdt)
    y = y + _off(C_row, cum_row, state[slots].unsqueeze(1))
    ops.ssd_commit_rows_(state, slots, row == chunk - 1, Bc, cum, xdt)
    return y[:, 0, 0]


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of the channels of y * silu(gate), fp32 (HF's MambaRMSNormGated)."""

    def __init__(self, dim: int, group_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size = group_size
        self.eps = eps

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        g = y.float() * silu(gate.float())
        groups = g.shape[-1] // self.group_size
        g = g.view(*g.shape[:-1], groups, self.group_size)
        out = ops.rms_norm(g, self.weight.float().view(groups, self.group_size), self.eps)
        return out.reshape(*y.shape)


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.index = index  # this layer's row in the cache's Mamba buffers
        mamba = cfg.mamba
        self.num_heads = mamba.num_heads
        self.head_dim = mamba.head_dim
        self.num_groups = mamba.num_groups
        self.state_size = mamba.state_size
        self.chunk = mamba.chunk_size
        self.kernel = mamba.conv_kernel
        self.dt_min = mamba.time_step_min
        self.inner = self.num_heads * self.head_dim
        self.conv_dim = self.inner + 2 * self.num_groups * self.state_size
        bias = mamba.proj_bias
        projected = self.inner + self.conv_dim + self.num_heads  # gate, x B C, dt
        self.in_proj = Linear(cfg.hidden_size, projected, bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=mamba.conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.norm = GatedRMSNorm(self.inner, self.inner // self.num_groups, cfg.rms_norm_eps)
        self.out_proj = Linear(self.inner, cfg.hidden_size, bias)

    def conv(self, xbc: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv + silu: xbc [b, T, Cd] after history [b, K-1, Cd] -> [b, T, Cd].

        fp32, taps added in a fixed order, so a position's value never depends on T.
        """
        seq = torch.cat([history, xbc], dim=1).float()
        weight = self.conv1d.weight.float()[:, 0]  # [Cd, K]
        length = xbc.shape[1]
        out = seq[:, 0:length] * weight[:, 0]
        for k in range(1, self.kernel):
            out = out + seq[:, k : k + length] * weight[:, k]
        if self.conv1d.bias is not None:
            out = out + self.conv1d.bias.float()
        return silu(out).to(xbc.dtype)

    def split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Post-conv channels [b, T, Cd] -> x [b, T, H, P], B, C [b, T, H, N] in fp32."""
        b, length, _ = xbc.shape
        g_n = self.num_groups * self.state_size
        x, B, C = xbc.float().split([self.inner, g_n, g_n], dim=-1)
        reps = self.num_heads // self.num_groups
        B = B.view(b, length, self.num_groups, -1).repeat_interleave(reps, dim=2)
        C = C.view(b, length, self.num_groups, -1).repeat_interleave(reps, dim=2)
        return x.view(b, length, self.num_heads, self.head_dim), B, C

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache=None, slots=None):
        """hidden [b, T, D], positions [b, T] (consecutive per row, every token real)."""
        batch, length, _ = hidden.shape
        gate, xbc, dt = self.in_proj(hidden).split(
            [self.inner, self.conv_dim, self.num_heads], dim=-1
        )
        dt = softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min)  # [b, T, H]
        A = -torch.exp(self.A_log.float())
        if cache is None:
            history = xbc.new_zeros(batch, self.kernel - 1, self.conv_dim)
        else:
            history = cache.conv[self.index, slots]
            cache.conv[self.index, slots] = torch.cat([history, xbc], dim=1)[:, length:]
        xbc = self.conv(xbc, history)
        decoding = cache is not None and length == 1
        chunked = cache is not None and is_enabled("mamba_chunked_decode")
        if decoding and chunked:
            y = self.chunked_step(xbc, dt, A, positions, cache, slots)
        elif decoding:
            y = self.step(xbc, dt, A, cache, slots)
        else:
            y = self.scan(xbc, dt, A, positions, cache, slots, chunked)
        x = self.split(xbc)[0]
        y = y + self.D.float()[:, None] * x  # [b, T, H, P]
        y = self.norm(y.reshape(batch, length, self.inner), gate)
        return self.out_proj(y.to(hidden.dtype))

    def step(self, xbc, dt, A, cache, slots) -> torch.Tensor:
        """The ordinary one-step recurrence h = exp(dt A) h + dt B x, y = C h (fix off)."""
        x, B, C = (t[:, 0] for t in self.split(xbc))  # [b, H, P], [b, H, N]
        dt = dt[:, 0]  # [b, H]
        h = cache.ssm[self.index, slots]  # [b, H, P, N]
        h = (
            torch.exp(dt * A)[..., None, None] * h
            + (x * dt[..., None]).unsqueeze(-1) * B[:, :, None]
        )
        cache.ssm[self.index, slots] = h.to(xbc.dtype).float()  # a model-dtype state cache
        return torch.einsum("bhpn,bhn->bhp", h, C).unsqueeze(1)

    def chunked_step(self, xbc, dt, A, positions, cache, slots) -> torch.Tensor:
        """Fix on, one token a row: buffer it in its chunk, compute its row as training does."""
        Q = self.chunk
        row = positions[:, 0] % Q  # [b]
        pick = torch.arange(row.shape[0], device=row.device)
        kept = (torch.arange(Q, device=row.device) < row[:, None]).unsqueeze(-1)  # [b, Q, 1]
        buf = cache.buf_xbc[self.index, slots]
        buf = torch.where(kept, buf, torch.zeros_like(buf))
        buf_dt = cache.buf_dt[self.index, slots]
        buf_dt = torch.where(kept, buf_dt, torch.zeros_like(buf_dt))
        buf[pick, row] = xbc[:, 0]
        buf_dt[pick, row] = dt[:, 0]
        x, B, C = self.split(buf)
        y = chunk_row(x, buf_dt, B, C, A, cache.ssm[self.index], slots, row)
        cache.buf_xbc[self.index, slots] = buf
        cache.buf_dt[self.index, slots] = buf_dt
        return y.unsqueeze(1)  # [b, 1, H, P]

    def scan(self, xbc, dt, A, positions, cache, slots, chunked: bool) -> torch.Tensor:
        """Chunk scan over (buffered partial chunk + these tokens) from the boundary state;
        `chunked`: the gen path with `mamba_chunked_decode`, rows resuming mid-chunk."""
        batch, length, _ = xbc.shape
        Q = self.chunk
        device = xbc.device
        if chunked:  # rows resume mid-chunk: r tokens of the chunk are buffered
            start = positions[:, 0] % Q  # [b]
            width = int(start.max().item()) + length
        else:  # train path (from position 0), or fix off: a fresh chunk from the state
            start = torch.zeros(batch, dtype=torch.long, device=device)
            width = length
        n = -(-width // Q)
        seq = xbc.new_zeros(batch, (n + 1) * Q, self.conv_dim)
        seq_dt = dt.new_zeros(batch, (n + 1) * Q, self.num_heads)
        if chunked:
            kept = (torch.arange(Q, device=device) < start[:, None]).unsqueeze(-1)
            buf = cache.buf_xbc[self.index, slots]
            seq[:, :Q] = torch.where(kept, buf, torch.zeros_like(buf))
            buf_dt = cache.buf_dt[self.index, slots]
            seq_dt[:, :Q] = torch.where(kept, buf_dt, torch.zeros_like(buf_dt))
        rows = torch.arange(batch, device=device)[:, None]
        cols = start[:, None] + torch.arange(length, device=device)  # [b, T]
        seq[rows, cols] = xbc
        seq_dt[rows, cols] = dt
        if cache is None:
            shape = (batch, self.num_heads, self.head_dim, self.state_size)
            h0 = torch.zeros(shape, device=device)
        else:
            h0 = cache.ssm[self.index, slots]
        x, B, C = self.split(seq[:, : n * Q])
        y, states = chunk_scan(x, seq_dt[:, : n * Q], B, C, A, h0, Q)
        if cache is not None:
            end = start + length  # [b]
            if chunked:  # commit the last filled boundary; buffer the partial chunk after it
                filled = end // Q
                cache.ssm[self.index, slots] = states[rows[:, 0], filled]
                tail = filled[:, None] * Q + torch.arange(Q, device=device)
                cache.buf_xbc[self.index, slots] = seq[rows, tail]
                cache.buf_dt[self.index, slots] = seq_dt[rows, tail]
            else:  # padding has dt = 0, so the last state is the state after the last token
                cache.ssm[self.index, slots] = states[:, n].to(xbc.dtype).float()
        return y[rows, cols]  # [b, T, H, P]
