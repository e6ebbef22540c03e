"""Find the first kernel where a batched decode row leaves the bits it has alone (CUDA).

    python scripts/probe_decode_rows.py [--batch 64] [--new 16] [OVERRIDE ...]

The model is the 1.5B unless an override names one (`model=tiny_gpt_oss`, or
`model.checkpoint=DIR` with `+precision=fp32 --device cpu`: the CPU's fp32 oracle).

Generates `--batch` requests (distinct prompt lengths) in one batch and each alone, scores
them on the train path, and prints per request where gen and train logprobs first differ.
For the first request whose batched decode differs from its solo decode, every `zkl.ops`
call of the decode steps is traced for its row in both runs and the first op whose output
row differs is printed with whether its inputs were equal: the op that breaks invariance.
"""

from __future__ import annotations

import argparse
import json

import torch

from zkl import invariance, ops
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.precision.recipes import DTYPES
from zkl.run.compose import compose
from zkl.trainer.scoring import score

TRACED = (
    "linear",
    "add_rms_norm",
    "rms_norm",
    "rotary",
    "rotary_into_cache",
    "silu_mul",
    "attention",
    "token_logprobs",
)


class Tracer:
    """Records one token's row of every traced op's output (and attention's keys/values).

    Decode mode: batch row `row` of a [B, 1, ...] call. Score mode: row `row`, position `pos`
    of a [B, T, ...] scoring call. `rotary_into_cache` is recorded under `rotary` (its q), so
    a decode step and the scoring forward give the same sequence of names per layer.
    """

    def __init__(self, score_pos: int | None = None) -> None:
        self.row: int | None = None
        self.slot: int | None = None
        self.score_pos = score_pos
        self.calls: list[tuple[str, list[torch.Tensor]]] = []
        self.originals = {name: getattr(ops, name) for name in TRACED}

    def _token(self, name: str, t: torch.Tensor) -> torch.Tensor:
        p = 0 if self.score_pos is None else self.score_pos
        t = t[self.row]
        t = t[:, p] if name == "attention" else t[p]
        return t.detach().float().cpu().clone()

    def install(self) -> None:
        for name, fn in self.originals.items():

            def wrapped(*args, _name=name, _fn=fn, **kwargs):
                out = _fn(*args, **kwargs)
                if self.row is None or _name in ("token_logprobs", "rms_norm"):
                    return out
                items = out if isinstance(out, tuple) else (out,)
                if _name == "rotary_into_cache" or _name == "rotary":
                    items = items[:1]
                if _name == "linear" and items[0].shape[-1] > 65536:
                    return out  # lm_head: chunked in scoring; compared as logprobs
                picked = [self._token(_name, t) for t in items]
                if _name == "attention":  # the keys and values this query reads
                    q, k, v, q_pos = args[:4]
                    kv_rows = args[4] if len(args) > 4 else kwargs.get("kv_rows")
                    slot = int(kv_rows[self.row]) if kv_rows is not None else self.row
                    p = 0 if self.score_pos is None else self.score_pos
                    end = int(q_pos[self.row, p]) + 1
                    picked += [k[slot, :, :end].float().cpu(), v[slot, :, :end].float().cpu()]
                label = "rotary" if _name == "rotary_into_cache" else _name
                self.calls.append((label, picked))
                return out

            setattr(ops, name, wrapped)

    def uninstall(self) -> None:
        for name, fn in self.originals.items():
            setattr(ops, name, fn)


def scheduler_with_tracer(
    model, batch: int, tracer: Tracer | None, target: int | None, at_pos: int | None = None
):
    scheduler = Scheduler(model, max_batch_size=batch, eos_id=None, cuda_graphs="off")
    if tracer is None:
        return scheduler
    prefill, decode = scheduler._prefill, scheduler._decode

    def traced_prefill(cache, state, admitted, *args):
        for slot, request in admitted:
            if request.request_id == target:
                tracer.slot = slot
        return prefill(cache, state, admitted, *args)

    def traced_decode(cache, state, running, *args):
        rows = list(running)
        tracer.row = rows.index(tracer.slot) if tracer.slot in rows else None
        if tracer.row is not None and at_pos is not None and int(state.pos[tracer.slot]) != at_pos:
            tracer.row = None
        try:
            return decode(cache, state, running, *args)
        finally:
            tracer.row = None

    scheduler._prefill, scheduler._decode = traced_prefill, traced_decode
    return scheduler


def first_difference(a, b, per_step: int | None = None) -> dict | None:
    """The first call whose recorded tensors differ between traces a and b."""
    for i, ((name_a, ts_a), (name_b, ts_b)) in enumerate(zip(a, b)):
        if name_a != name_b:
            return {"index": i, "error": f"call order differs: {name_a} vs {name_b}"}
        same = [x.shape == y.shape and torch.equal(x, y) for x, y in zip(ts_a, ts_b)]
        if not all(same):
            out = {"index": i, "op": name_a, "tensors_equal": same}
            if per_step:
                out.update(step=i // per_step, call_in_step=i % per_step)
            out["max_abs"] = [
                float((x - y).abs().max()) if x.shape == y.shape else None
                for x, y in zip(ts_a, ts_b)
            ]
            out["elements_differing"] = [
                int((x != y).sum()) if x.shape == y.shape else None for x, y in zip(ts_a, ts_b)
            ]
            out["shapes"] = [list(x.shape) for x in ts_a]
            return out
    return {"equal_calls": min(len(a), len(b))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--solo", type=int, default=64, help="requests also run alone")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--trace",
        type=int,
        nargs=2,
        metavar=("REQUEST", "TOKEN"),
        help="trace decode vs scoring at this token even if it agrees",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    # the 1.5B unless the overrides name a model (a group, or a checkpoint's own config)
    named = any(o.startswith(("model=", "model.checkpoint=")) for o in args.overrides)
    default = [] if named else ["model=qwen2_5_1_5b"]
    cfg = compose([f"device={args.device}", *default, *args.overrides])
    fixes = invariance.from_config(cfg)
    torch.manual_seed(0)
    prompts = [
        torch.randint(10, cfg.model.vocab_size - 10, (40 + i,)).tolist() for i in range(args.batch)
    ]
    requests = [
        Request(i, p, SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=1000 + i))
        for i, p in enumerate(prompts)
    ]
    with invariance.enabled(fixes), torch.no_grad():
        model = build_model(
            cfg.model,
            DTYPES[cfg.precision.compute_dtype],
            cfg.precision.linear_quant,
            cfg.seed,
            args.device,
        )
        batched = scheduler_with_tracer(model, args.batch, None, None).generate(requests)
        batched.sort(key=lambda c: c.request_id)
        solo_scheduler = scheduler_with_tracer(model, 1, None, None)
        solo = [solo_scheduler.generate([r])[0] for r in requests[: args.solo]]
        train = score(model, prompts, [c.tokens for c in batched], [1.0] * len(prompts))
        report = []
        for i, c in enumerate(batched):
            row = {"request": i, "prompt_len": len(prompts[i])}
            gen_vs_train = (c.logprobs != train[i]).nonzero()
            row["batched_vs_train_first"] = int(gen_vs_train[0]) if len(gen_vs_train) else None
            row["batched_vs_train_max"] = float((c.logprobs - train[i]).abs().max())
            if i < len(solo):
                s = solo[i]
                row["solo_same_tokens"] = s.tokens == c.tokens
                if s.tokens == c.tokens:
                    d = (s.logprobs != c.logprobs).nonzero()
                    row["batched_vs_solo_first"] = int(d[0]) if len(d) else None
                    solo_train = score(model, [prompts[i]], [s.tokens], [1.0])[0]
                    d = (s.logprobs != solo_train).nonzero()
                    row["solo_vs_train_first"] = int(d[0]) if len(d) else None
                    d = (solo_train != train[i]).nonzero()
                    row["train_batch_vs_train_solo_first"] = int(d[0]) if len(d) else None
            report.append(row)
        bad = [r for r in report if r["batched_vs_train_first"] is not None]
        print(json.dumps({"mismatching_requests": len(bad), "of": len(report)}))
        for r in report:
            if r["batched_vs_train_first"] is not None or r.get("solo_vs_train_first") is not None:
                print(json.dumps(r))
        target = next(
            (r["request"] for r in report if r.get("batched_vs_solo_first") is not None), None
        )
        if target is not None:  # batched vs solo decode, every decode step of the request
            traces = []
            for batch, reqs in ((args.batch, requests), (1, [requests[target]])):
                tracer = Tracer()
                tracer.install()
                try:
                    scheduler_with_tracer(model, batch, tracer, target).generate(reqs)
                finally:
                    tracer.uninstall()
                traces.append(tracer.calls)
            per_step = len(traces[1]) // max(1, args.new - 1)
            print(json.dumps({"batched_vs_solo": target, "calls": [len(t) for t in traces]}))
            print(json.dumps(first_difference(*traces, per_step)))
        first = next((r for r in report if r["batched_vs_train_first"]), None)
        if args.trace:
            first = {"request": args.trace[0], "batched_vs_train_first": args.trace[1]}
        if first is None:
            return
        # decode (batched) vs scoring at the first mismatching token of the first request
        target, j = first["request"], first["batched_vs_train_first"]
        pos = len(prompts[target]) - 1 + j
        traces = []
        tracer = Tracer()
        tracer.install()
        try:
            scheduler_with_tracer(model, args.batch, tracer, target, at_pos=pos).generate(requests)
        finally:
            tracer.uninstall()
        traces.append(tracer.calls)
        tracer = Tracer(score_pos=pos)
        tracer.row = target
        tracer.install()
        try:
            score(model, prompts, [c.tokens for c in batched], [1.0] * len(prompts))
        finally:
            tracer.uninstall()
        traces.append(tracer.calls)
        print(
            json.dumps(
                {
                    "decode_vs_score": target,
                    "token": j,
                    "position": pos,
                    "calls": [len(t) for t in traces],
                }
            )
        )
        print(json.dumps(first_difference(*traces)))


if __name__ == "__main__":
    main()
