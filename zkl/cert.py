"""`python -m zkl.cert`: certify beds bitwise, and never pass a bed that tested nothing.

What is certified is what `python -m zkl` would run with the same config and overrides. The
bed axes `cert.models`, `cert.precisions`, `cert.layouts` and `cert.kv` are null by default:
then the one bed is the user's config. A list certifies one bed per combination of options;
each option is `conf/<group>/<option>.yaml` with the user's own edits of that group kept
(`model.num_hidden_layers=4` holds for every model), and every other key is the user's. An
empty list, `cert.steps=1`, or a bed this machine cannot run is refused with one sentence
(exit 2) before any work.

Step-0 (`cert.steps=0`): generate with the initial weights under several schedules
(batch sizes, arrival orders, chunked prefill, prompts of varied length behind a shared
prefix) and score every rollout with several micro-batch groupings; every token must agree
bitwise. Multi-step (`cert.steps=N`, N >= 2): N real GRPO steps with updates and refits,
every step exactly zero, and every step must have trained: some advantage non-zero, an
update that changed the weights the generator gets, the next rollout on the refitted
version. A bed that misses one fails with a sentence naming the step and the reason.

`cert.ablate=true` turns each fix off in turn, in a mode that can expose it (`zkl.ablation`).
Progress goes to stderr, one line as each run starts and ends; the table, then the paths of
`cert.jsonl` and `cert.txt`, to stdout. Exit 0 when every bed passes, 1 when one fails or
none ran, 2 when the config is refused.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import operator
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from zkl import ablation, environment, invariance, run_lock
from zkl.ablation import Mode
from zkl.cli import guarded, hydra_entry
from zkl.config import CONF_DIR, ZklConfig, to_object, validate, with_group_option
from zkl.device import resolve_device
from zkl.errors import ConfigError, NonFinite
from zkl.generation.engine import Request
from zkl.generation.sampling import SamplingParams
from zkl.layouts import build_generator
from zkl.rl import loop
from zkl.rl.metrics import mismatch_metrics
from zkl.rl.task import build_task
from zkl.trainer.policy import Policy
from zkl.trainer.scoring import score

# (max_batch_size, prefill_chunk, arrival order, scoring micro-batch)
SCHEDULES = [
    (1, 0, "natural", 0),
    (3, 5, "reversed", 1),
    (8, 0, "shuffled", 7),
    (5, 16, "shuffled", 3),
]
NUM_PROMPTS = 12
AXES = {"model": "models", "precision": "precisions", "layout": "layouts", "kv": "kv"}
RESULTS_FILE, TABLE_FILE = "cert.jsonl", "cert.txt"


# A bed's folder is built from these config values, one path component each.
FOLDER_KEYS = ("model.name", "layout.name", "precision.name", "kv.mode")
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


def folder_name(value: str, key: str) -> str:
    """`value` as one folder name, or ConfigError naming `key`: no `..`, `/`, absolute path,
    hidden name, or character a shell or another file system would read differently."""
    if not isinstance(value, str) or not _FOLDER_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            f"{key}={value!r} names a folder of the cert run directory, so it must be one "
            "name of letters, digits and . _ + = - (starting with a letter or digit, no '..', "
            f"at most 200 characters); change {key}."
        )
    return value


def bed_name(cfg: ZklConfig) -> str:
    """`model/layout/precision/kv_mode[/wsN]`: a path under the run directory, checked part
    by part; a sharded trainer's world size is its own level."""
    parts = [folder_name(operator.attrgetter(k)(cfg), k) for k in FOLDER_KEYS]
    ranks = f"/ws{cfg.trainer.world_size}" if cfg.trainer.world_size > 1 else ""
    return "{}/{}/{}/kv_{}".format(*parts) + ranks


def bed_dir(run_dir: Path, run: Run) -> Path:
    """Where a run's metrics land; never outside `run_dir` (each part was checked in plan)."""
    parts = [run.bed, folder_name(str(run.mode), "cert.steps"), folder_name(run.variant, "fixes")]
    path = run_dir / "beds" / Path(*parts)
    assert path.resolve().is_relative_to(run_dir.resolve()), path
    return path


def beds(cfg: ZklConfig) -> list[ZklConfig]:
    """The user's config, varied along the axes the `cert` config names (null: not varied)."""
    options = []
    for group, axis in AXES.items():
        names = getattr(cfg.cert, axis)
        if names is not None and not names:
            raise ConfigError(
                f"cert.{axis}=[] names no {group}, so no bed would run; name at least one, "
                f"or leave cert.{axis} null to certify your own {group}."
            )
        for name in names or []:  # an option is a file name under conf/<group>/
            folder_name(name, f"cert.{axis}")
        options.append([None] if names is None else list(dict.fromkeys(names)))
    out = []
    for combo in itertools.product(*options):
        bed = cfg
        for group, option in zip(AXES, combo):
            if option is not None:
                bed = with_group_option(bed, group, option)
        out.append(bed)
    return out


def cert_requests(cfg: ZklConfig, task, seed: int) -> list[Request]:
    """Prompts of varied length behind the task's shared system prefix."""
    sp = cfg.sampling
    return [
        Request(
            i,
            prompt,
            SamplingParams(sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, seed + i),
        )
        for i, prompt in enumerate(task.varied_prompts(seed, NUM_PROMPTS))
    ]


def check(cfg: ZklConfig) -> None:
    """Every config check the run of `cfg` makes, made before any bed starts."""
    task = build_task(cfg.task, cfg.model.vocab_size)
    if cfg.cert.steps == 0 and cfg.trainer.world_size > 1:
        raise ConfigError(
            "cert.steps=0 runs in one process; certify trainer.world_size="
            f"{cfg.trainer.world_size} with cert.steps=N (N >= 2): its ranks run N GRPO steps."
        )
    if cfg.cert.steps == 0:
        longest = max(len(r.prompt) for r in cert_requests(cfg, task, cfg.seed))
        validate(cfg, len(task.tokenizer), longest + 1 + cfg.sampling.max_new_tokens)
    else:
        loop.validate_run(cfg, task)


def certify_step0(cfg: ZklConfig) -> dict[str, Any]:
    """Generate under every schedule, score under several groupings, compare every token."""
    check(cfg)
    task = build_task(cfg.task, cfg.model.vocab_size)
    requests = cert_requests(cfg, task, cfg.seed)
    lp_train, lp_gen = [], []
    with invariance.enabled(invariance.from_config(cfg)):
        policy = Policy(cfg)
        generator = build_generator(cfg, policy, task.tokenizer.eos_id)
        try:
            generator.refit(policy.refit_state(), policy.version)
            for i, (batch_size, chunk, order, micro) in enumerate(SCHEDULES):
                generator.configure(batch_size, chunk)
                ordered = list(requests)
                if order == "reversed":
                    ordered.reverse()
                elif order == "shuffled":
                    random.Random(i).shuffle(ordered)
                completions, _ = generator.generate(ordered)
                scored = score(
                    policy.model,
                    [c.prompt for c in completions],
                    [c.tokens for c in completions],
                    [r.params.temperature for r in ordered],
                    micro,
                )
                lp_train += scored
                lp_gen += [c.logprobs for c in completions]
        finally:
            generator.close()
    metrics = mismatch_metrics(torch.cat(lp_train), torch.cat(lp_gen))
    metrics["tokens"] = int(sum(t.numel() for t in lp_gen))
    metrics.update(steps=1, update_norm=None, weight_version=0, reasons=[])
    return metrics


def untrained_steps(rows: list[dict[str, Any]]) -> list[str]:
    """Why steps of a multi-step run certified no refit of new weights (empty: none)."""
    reasons = []
    for row, following in itertools.zip_longest(rows, rows[1:]):
        step = row["step"]
        if row["rl/zero_adv_frac"] == 1.0:
            reasons.append(
                f"every advantage of step {step} was zero (equal rewards in each group), "
                "so it trained nothing"
            )
        elif row["weights/changed_tensors"] == 0:
            reasons.append(
                f"the update of step {step} (norm {row['optim/update_norm']:.3g}) changed none "
                "of the weights the generator gets, e.g. a learning rate below their resolution"
            )
        if following is not None and following["gen/weight_version"] != row["weights/version"]:
            reasons.append(
                f"step {following['step']} rolled out with weight version "
                f"{following['gen/weight_version']}, not the refitted {row['weights/version']}"
            )
    return reasons


def certify_steps(cfg: ZklConfig, run_dir: Path) -> dict[str, Any]:
    """N real GRPO steps; the bed's metrics are the worst step's."""
    cfg = dataclasses.replace(
        cfg,
        rl=dataclasses.replace(cfg.rl, steps=cfg.cert.steps),
        checkpoint=dataclasses.replace(cfg.checkpoint, save=False),  # a bed is never resumed
    )
    rows = loop.run(cfg, run_dir, progress=False)
    worst = max(rows, key=lambda r: r["train/max_abs_logprob_diff"])
    metrics = {k: v for k, v in worst.items() if k.startswith("train/")}
    metrics["train/bitwise_equal_frac"] = min(r["train/bitwise_equal_frac"] for r in rows)
    metrics["train/gen_kl_error"] = max(r["train/gen_kl_error"] for r in rows)
    metrics["tokens"] = int(sum(r["gen/response_tokens"] for r in rows))
    metrics["steps"] = len(rows)
    metrics["nonzero_steps"] = sum(r["train/max_abs_logprob_diff"] != 0.0 for r in rows)
    metrics["update_norm"] = min(r["optim/update_norm"] for r in rows)
    metrics["weight_version"] = rows[-1]["gen/weight_version"]
    metrics["reasons"] = untrained_steps(rows)
    return metrics


def certify(cfg: ZklConfig, run_dir: Path) -> dict[str, Any]:
    if cfg.cert.steps > 0:
        return certify_steps(cfg, run_dir)
    return certify_step0(cfg)


@dataclasses.dataclass
class Run:
    """One run of the plan: a bed, all fixes on in an ablation mode, or one fix off."""

    bed: str
    kind: str  # "bed" | "reference" | "ablation"
    mode: Mode
    cfg: ZklConfig
    fix: str | None = None  # the fix an ablation run turns off
    reference: ZklConfig | None = None  # what an ablation run is judged against
    refused: str | None = None  # why this machine cannot run an ablation mode of the bed

    @property
    def variant(self) -> str:
        return invariance.label(invariance.from_config(self.cfg))


def plan(cfg: ZklConfig) -> list[Run]:
    """Every run, each reference before the runs judged against it; all checked up front."""
    if cfg.cert.steps == 1:
        raise ConfigError(
            "cert.steps=1 certifies no refit (its one rollout sees the initial weights); "
            "use 0 for step-0 or at least 2."
        )
    if cfg.cert.ablate and not invariance.from_config(cfg):
        raise ConfigError(
            "cert.ablate=true turns the fixes off one at a time, but none is on; "
            "set zero_train_gen_mismatch=true."
        )
    environment.check(wandb_on=False)  # the beds' generators read the preemption signal
    runs: list[Run] = []
    for bed in beds(cfg):
        check(bed)
        name = bed_name(bed)
        runs.append(Run(name, "bed", Mode(steps=bed.cert.steps), bed))
        for fix, mode, reference, off in ablation.variants(bed) if cfg.cert.ablate else []:
            try:
                check(reference)
                refused = None
            except ConfigError as err:
                refused = str(err)
            if not any(r.cfg == reference for r in runs):
                runs.append(Run(name, "reference", mode, reference, refused=refused))
            runs.append(Run(name, "ablation", mode, off, fix, reference, refused))
    return runs


def execute(run: Run, run_dir: Path, done: list[tuple[Run, dict[str, Any]]]) -> dict[str, Any]:
    """Certify one run; its row with a `passed` flag and a `result` in words."""
    row: dict[str, Any] = {"bed": run.bed, "kind": run.kind, "variant": run.variant}
    row.update(mode=str(run.mode), fix=run.fix)
    if run.refused:
        row.update(passed=False, result=f"cannot run in this mode: {run.refused}")
        return row
    try:
        row.update(certify(run.cfg, bed_dir(run_dir, run)))
    except NonFinite as exc:  # the bed fails; the other beds still run
        row.update(passed=False, result=f"FAIL: {exc}")
        return row
    row["passed"] = row["train/max_abs_logprob_diff"] == 0.0 and not row["reasons"]
    if run.kind == "ablation":
        reference = next(ref for r, ref in done if r.kind != "ablation" and r.cfg == run.reference)
        row["result"] = ablation.verdict(run.fix, run.cfg, row, reference)
    else:
        row["result"] = "PASS" if row["passed"] else "FAIL"
        if row["reasons"]:
            row["result"] += ": " + row["reasons"][0]
    return row


def progress(message: str) -> None:
    print(f"zkl.cert {message}", file=sys.stderr, flush=True)


def run_cert(cfg: ZklConfig, run_dir: str | Path) -> list[dict[str, Any]]:
    """Certify every bed (with cert.ablate, every fix off in turn); write and print the table."""
    run_dir = Path(run_dir)
    runs = plan(cfg)
    with run_lock.held(run_dir):  # each bed's own run directory is locked by loop.run too
        return _run_all(runs, run_dir)


def _run_all(runs: list[Run], run_dir: Path) -> list[dict[str, Any]]:
    done: list[tuple[Run, dict[str, Any]]] = []
    with open(run_dir / RESULTS_FILE, "w") as f:  # a row as each run ends
        for i, run in enumerate(runs, 1):
            tag = f"[{i}/{len(runs)}] {run.bed} {run.variant} ({run.mode})"
            progress(f"{tag} ...")
            device = resolve_device(run.cfg.device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            row = execute(run, run_dir, done)
            row["seconds"] = time.perf_counter() - start
            memory = ""
            if device.type == "cuda":
                row["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
                memory = f", peak GPU memory {row['peak_gpu_mem_gb']:.1f} GiB"
            progress(f"{tag}: {row['result']} ({row['seconds']:.1f}s{memory})")
            done.append((run, row))
            f.write(json.dumps(row) + "\n")
            f.flush()
            if device.type == "cuda":  # the next bed's memory check must see this one's freed
                gc.collect()
                torch.cuda.empty_cache()
    results = [row for _, row in done]
    table = format_table(results)
    (run_dir / TABLE_FILE).write_text(table + "\n")
    print(table)
    print(f"results: {run_dir / RESULTS_FILE} (one JSON object per row), {run_dir / TABLE_FILE}")
    return results


# (header, row key, width, format); "s" columns are left-aligned
COLUMNS = [
    ("bed", "bed", 40, "s"),
    ("variant", "variant", 32, "s"),
    ("mode", "mode", 23, "s"),
    ("steps", "steps", 5, "d"),
    ("tokens", "tokens", 7, "d"),
    ("max_abs_diff", "train/max_abs_logprob_diff", 12, ".3g"),
    ("gen_kl_error", "train/gen_kl_error", 12, ".3g"),
    ("bitwise", "train/bitwise_equal_frac", 7, ".3f"),
    ("update_norm", "update_norm", 11, ".3g"),
    ("version", "weight_version", 7, "d"),
]


def format_table(results: list[dict[str, Any]]) -> str:
    """One line per row; `update_norm` is the smallest of the bed's steps, `version` the weight
    version of its last rollout (both `-` / 0 for step-0)."""

    def cell(value: Any, width: int, fmt: str) -> str:
        text = "-" if value is None else format(value, fmt)
        return text.ljust(width) if fmt == "s" else text.rjust(width)

    head = " ".join(h.ljust(w) if f == "s" else h.rjust(w) for h, _, w, f in COLUMNS)
    head += "  result"
    lines = [head, "-" * len(head)]
    for r in results:
        cells = " ".join(cell(r.get(key), w, f) for _, key, w, f in COLUMNS)
        lines.append(f"{cells}  {r['result']}")
    return "\n".join(lines)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    guarded("zkl.cert", lambda: certify_all(dcfg))


def certify_all(dcfg: DictConfig) -> int:
    """The exit code: 0 when every certified bed is exactly zero, else 1."""
    results = run_cert(to_object(dcfg), HydraConfig.get().runtime.output_dir)
    certified = [r for r in results if r["kind"] == "bed"]
    if not certified:
        print("zkl.cert: no bed ran, so nothing is certified.", file=sys.stderr)
        return 1
    return 0 if all(r["passed"] for r in certified) else 1


def list_fixes() -> str:
    """The registry (zkl/invariance.py): each fix's name, cause and remedy, and its key."""
    blocks = [f"{len(invariance.FIXES)} fixes; fixes.<name>=false turns one off:"]
    for fix in invariance.FIXES.values():
        blocks.append(
            f"{fix.name}\n  cause: {fix.cause}\n  fix:   {fix.remedy}\n  test:  {fix.test}"
        )
    return "\n".join(blocks)


if __name__ == "__main__":
    if "--list-fixes" in sys.argv[1:]:
        print(list_fixes())
        sys.exit(0)
    hydra_entry("zkl.cert", main)
