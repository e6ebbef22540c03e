"""Mixture-of-experts dispatch shared by every MoE layer: route, group, combine.

`SparseMoE` is the layer every native family's MoE extends (Qwen3-MoE, Nemotron-H, gpt-oss):
a family gives its router (`choose_experts`) and its experts (`grouped_experts`); the base
runs route, tape, grouping and combine, and is the one place that reads `moe_combine_order`.

A layer's (token, slot) pairs are grouped per expert by one stable sort of their expert ids;
the group offsets come from a search in the sorted ids, so they stay on the device and a
decode step with MoE layers never waits on the host (the experts then run as one grouped
GEMM, `zkl.ops.grouped_linear`). With `moe_combine_order` (`fixed`) each pair's result lands
in its own fp32 row and a token adds its experts in top-k slot order; without it a token adds
them in dispatch order, in the activation dtype, as one `index_add` per expert would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from zkl import ops
from zkl.invariance import is_enabled
from zkl.precision.recipes import quantizes
from zkl.routes import RouteTape


def router_probs(x: torch.Tensor, gate_weight: torch.Tensor, fixed: bool) -> torch.Tensor:
    """The router's fp32 probabilities [N, E] of x [N, H]: with `moe_combine_order` (`fixed`)
    fp32 logits and the invariant softmax; else logits in the activation dtype, as eager
    PyTorch computes them."""
    if fixed:
        return ops.softmax(ops.linear(x.float(), gate_weight.float(), None))
    return torch.softmax(ops.linear(x, gate_weight.to(x.dtype), None).float(), dim=-1)


def renormalized(top_w: torch.Tensor, fixed: bool) -> torch.Tensor:
    """top_w [N, k] over its row sum; `fixed` adds the slots in order, whatever the row count."""
    if not fixed:
        return top_w / top_w.sum(-1, keepdim=True)
    total = top_w[:, 0]
    for s in range(1, top_w.shape[-1]):
        total = total + top_w[:, s]
    return top_w / total.unsqueeze(-1)


def fixed_route(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `moe_combine_order` router: fp32 logits and softmax, ties to the lower expert id.

    x [N, H] -> (expert ids [N, k], fp32 weights [N, k]); shared by every engine's MoE.
    """
    probs = router_probs(x, gate_weight, fixed=True)
    # stable sort: equal probabilities resolve to the lower expert id
    top_w, top_i = probs.sort(dim=-1, descending=True, stable=True)
    top_w, top_i = top_w[:, :top_k], top_i[:, :top_k]
    if norm_topk_prob:
        top_w = renormalized(top_w, fixed=True)
    return top_i, top_w


def taped_route(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_i: torch.Tensor,
    top_w: torch.Tensor,
    norm_topk_prob: bool,
    fixed: bool,
    tape: RouteTape | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's own route (top_i, top_w [N, k]) as the forward's route tape has it
    (`zkl.routes`): recorded and returned unchanged, or replayed: the tape's expert
    ids (own ones where it has none) weighted by this router's probabilities of them,
    renormalised as the router renormalises (R3: the gate stays differentiable, the choice is
    the generator's). No tape: unchanged."""
    if tape is None:
        return top_i, top_w
    given = tape.visit(top_i)
    if given is None:
        return top_i, top_w
    ids = torch.where(given >= 0, given, top_i)
    weights = router_probs(x, gate_weight, fixed).gather(-1, ids)
    return ids, renormalized(weights, fixed) if norm_topk_prob else weights


def group_by_expert(top_i: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_i [N, k] -> (pair ids grouped by expert [N*k], offsets [E + 1]), both on the device.

    Pair p is (token p // k, slot p % k). Group e is by_expert[offsets[e]:offsets[e + 1]], its
    pairs in token order (stable sort). The offsets are a search of the sorted ids (no
    bincount: on CUDA that reads its size back to the host).
    """
    pairs = top_i.reshape(-1)
    sorted_ids, by_expert = torch.sort(pairs, stable=True)
    bounds = torch.arange(num_experts + 1, device=pairs.device, dtype=pairs.dtype)
    return by_expert, torch.searchsorted(sorted_ids, bounds)


def combine(
    results: torch.Tensor,
    by_expert: torch.Tensor,
    top_i: torch.Tensor,
    top_w: torch.Tensor,
    fixed: bool,
    expert_order: Sequence[int] | None = None,
) -> torch.Tensor:
    """Each pair's expert output (`results` [N*k, H], grouped as `by_expert`) weighted and
    added per token -> [N, H] in the results' dtype.

    Fixed: in fp32, in top-k slot order. Default: in the activation dtype, in dispatch order
    (expert id, or `expert_order`: tests only, as another GPU dispatch may run), each add
    rounded as one `index_add` per expert rounds it.
    """
    num_tokens, top_k = top_w.shape
    width, dtype = results.shape[-1], results.dtype
    if fixed:
        per_pair = results.new_empty(results.shape, dtype=torch.float32)
        per_pair = per_pair.index_copy(0, by_expert, results.float())
        weighted = per_pair.view(num_tokens, top_k, width) * top_w.unsqueeze(-1)
        out = weighted[:, 0]
        for s in range(1, top_k):  # fixed order: top-k slot 0, 1, ...
            out = out + weighted[:, s]
        return out.to(dtype)
    per_pair = results.new_empty(results.shape).index_copy(0, by_expert, results)
    weighted = (per_pair * top_w.reshape(-1, 1).to(dtype)).view(num_tokens, top_k, width)
    dispatched = top_i
    if expert_order is not None:
        dispatched = torch.argsort(torch.tensor(expert_order)).to(top_i.device)[top_i]
    order = torch.sort(dispatched, dim=-1, stable=True).indices  # [N, k] slots by dispatch
    weighted = weighted.gather(1, order.unsqueeze(-1).expand(-1, -1, width))
    out = results.new_zeros(num_tokens, width)
    for s in range(top_k):
        out = out + weighted[:, s]
    return out


def run_experts(
    x: torch.Tensor,
    top_i: torch.Tensor,
    top_w: torch.Tensor,
    experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    fixed: bool,
    expert_order: Sequence[int] | None = None,
) -> torch.Tensor:
    """x [N, H] through its top-k experts (`experts[e](rows)` -> [n, H]), one call each,
    weighted and added. For experts that are only callables (megatron's modules, a quantizing
    recipe's per-group input scales): a host loop that reads the group sizes once."""
    by_expert, offsets = group_by_expert(top_i, len(experts))
    rows = x[by_expert // top_i.shape[-1]]
    bounds = offsets.tolist()
    groups = zip(experts, bounds[:-1], bounds[1:])
    parts = [expert(rows[lo:hi]) for expert, lo, hi in groups if hi > lo]
    results = torch.cat(parts) if parts else x.new_zeros(0, x.shape[-1])
    return combine(results, by_expert, top_i, top_w, fixed, expert_order)


def top_k_softmax_route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, fixed: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's router: logits with a bias, the top k of them, a softmax over those k.

    x [N, H] -> (expert ids [N, k], fp32 weights [N, k]). Fixed (`moe_combine_order`): fp32
    logits, a stable sort (ties to the lower expert id), an fp32 softmax; default: the
    activation dtype and `topk`, as eager PyTorch runs it.
    """
    if fixed:
        logits = ops.linear(x.float(), weight.float(), bias.float())
        top_v, top_i = logits.sort(dim=-1, descending=True, stable=True)
        return top_i[:, :top_k], ops.softmax(top_v[:, :top_k])
    logits = ops.linear(x, weight.to(x.dtype), bias.to(x.dtype))
    top_v, top_i = logits.topk(top_k, dim=-1)
    return top_i, torch.softmax(top_v, dim=-1).float()


def grouped_bias(
    biases: torch.Tensor, top_i: torch.Tensor, by_expert: torch.Tensor
) -> torch.Tensor:
    """Each grouped pair's expert bias: biases [E, N] -> [N*k, N] in `by_expert` order (a
    gather on the device, so the layer still reads nothing back to the host)."""
    return biases[top_i.reshape(-1)[by_expert]]


def fixed_order() -> bool:
    """Whether `moe_combine_order` is on: an fp32 router, ties to the lower expert id, and
    each token's experts added in fp32 in top-k slot order."""
    return is_enabled("moe_combine_order")


class SparseMoE(nn.Module):
    """A top-k MoE layer: each token through the experts its router chooses, weighted and
    added. A family sets `top_k`, `gate` and `experts` and gives `choose_experts` and
    `grouped_experts`; the tokens are grouped per expert on the device and the experts run as
    grouped GEMMs, so the layer reads nothing back to the host."""

    top_k: int
    experts: nn.ModuleList

    def choose_experts(self, x: torch.Tensor, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k]), `fixed` as `fixed_order`."""
        raise NotImplementedError

    def grouped_experts(
        self,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        top_i: torch.Tensor,
        by_expert: torch.Tensor,
    ) -> torch.Tensor:
        """rows [P, H] grouped per expert at `offsets` -> each row through its expert (`top_i`
        and `by_expert` name each row's expert, for a family with per-expert biases)."""
        raise NotImplementedError

    def replayed(
        self,
        x: torch.Tensor,
        top_i: torch.Tensor,
        top_w: torch.Tensor,
        fixed: bool,
        routes: RouteTape | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The route as the forward's tape `routes` has it (routing replay, `taped_route`)."""
        return taped_route(x, self.gate.weight, top_i, top_w, self.norm_topk_prob, fixed, routes)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k]) under the fixes on."""
        return self.choose_experts(x, fixed_order())

    @property
    def runs_one_call_per_expert(self) -> bool:
        """Under a quantizing recipe each expert scales its own group's input (a per-tensor
        scale sees that group alone), so each expert runs as one call: a host read of the
        group sizes."""
        return quantizes(self.experts[0])

    def forward(
        self,
        x: torch.Tensor,
        expert_order: list[int] | None = None,
        routes: RouteTape | None = None,
    ) -> torch.Tensor:
        """x [..., H] -> [..., H]; `routes` the forward's route tape (records or replays this
        layer's experts); `expert_order` (tests only) adds the groups in another order, as
        GPU atomics may."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, H]
        fixed = fixed_order()
        top_i, top_w = self.choose_experts(x, fixed)
        top_i, top_w = self.replayed(x, top_i, top_w, fixed, routes)
        if self.runs_one_call_per_expert:
            out = run_experts(x, top_i, top_w, list(self.experts), fixed, expert_order)
            return out.reshape(shape)
        by_expert, offsets = group_by_expert(top_i, len(self.experts))
        results = self.grouped_experts(x[by_expert // self.top_k], offsets, top_i, by_expert)
        return combine(results, by_expert, top_i, top_w, fixed, expert_order).reshape(shape)
