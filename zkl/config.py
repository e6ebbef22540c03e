"""The typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

`conf/` holds the group options as YAML data; these dataclasses are their schema, so a
misspelt key fails with Hydra's own error (and one added with `+`, in `to_object`).
`precision` and `layout` are in the primary defaults list like the other groups, and
`+precision=...` still works (`zkl.overrides.normalize`).
`validate` turns a config that cannot work into one sentence naming the key to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from zkl.checkpoint_check import check_checkpoint
from zkl.config_checkpoint import hydra_overrides, resolve_checkpoint
from zkl.config_keys import reject_unknown_keys
from zkl.device import check_device, generator_device, resolve_device
from zkl.distributed.checks import check_trainer
from zkl.distributed.config import TrainerConfig
from zkl.errors import ConfigError
from zkl.generation.graphs import GRAPH_SETTINGS, graph_setting
from zkl.invariance import FIXES
from zkl.megatron.check import engine_problem
from zkl.megatron.mapping import ENGINES
from zkl.memory import check_memory
from zkl.models.config import ModelConfig, validate_model
from zkl.overrides import normalize
from zkl.validation import check_limits, check_values, default_positions

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@dataclass
class PrecisionConfig:
    name: str = "bf16"
    compute_dtype: str = "bfloat16"  # bfloat16 | float32
    linear_quant: str = "none"  # none | mxfp8 | fp8_tensor
    master_weights_fp32: bool = True  # fp32 copy for the optimizer when compute is bf16
    native: bool = False  # native MXFP8 GEMMs (Transformer Engine on Blackwell)


@dataclass
class LayoutConfig:
    name: str = "colocated"  # colocated | dedicated
    # How the dedicated refit moves weights: gloo (torch.distributed, CPU), cuda_ipc (one
    # GPU shared by both processes: device memory handed over, no host round trip), nccl
    # (the generator on a GPU of its own, broadcast over NCCL); auto: gloo on the CPU,
    # cuda_ipc on CUDA.
    backend: str = "auto"
    # The generator's GPU with backend=nccl (null: the GPU after the trainer's `device`);
    # the other backends keep the generator on the trainer's device.
    generator_device: str | None = None
    timeout_s: float = 600.0


@dataclass
class EngineConfig:
    name: str = "native"
    max_batch_size: int = 8  # continuous-batching slots
    prefill_chunk: int = 0  # 0: whole prompt in one forward
    prefix_cache_blocks: int = 4096
    sync_every: int = 0  # decode steps between host looks at finished rows; 0: 1 CPU, 8 CUDA
    # Decode in CUDA graphs: auto (on where the model's decode can be captured, on CUDA) |
    # on (refuse where it cannot) | off (eager).
    cuda_graphs: str = "auto"


@dataclass
class KVConfig:
    mode: str = "recompute"  # recompute | persist


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 6
    ignore_eos: bool = False  # true: every response is exactly max_new_tokens (benchmarks)


@dataclass
class TaskConfig:
    # add (character tokenizer) | residue (the model's whole vocabulary) | dataset (yours)
    name: str = "add"
    max_operand: int = 4  # add: a + b with a, b in 0..max_operand
    modulus: int = 3  # residue: reward = response tokens congruent to the last prompt token
    min_prompt_len: int = 4  # residue: random tail length after the shared 32-token prefix
    max_prompt_len: int = 48
    # dataset (zkl/data): local JSONL or Parquet files read through HF datasets, offline.
    path: str | None = None  # the train split
    val_path: str | None = None  # the validation split (rl.val_every needs one)
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    reward: str = "math"  # math (math-verify) | exact | package.module:function
    tokenizer: str | None = None  # a directory with tokenizer.json; null: model.checkpoint
    chat_template: bool = False  # wrap each prompt as a user turn in the tokenizer's template
    # A task class of your own, built as Class(task_cfg, vocab_size); `params` are its knobs.
    _target_: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RLConfig:
    steps: int = 20
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    lr: float = 1e-2
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # k3 penalty against the initial policy
    grad_clip: float = 1.0
    num_minibatches: int = 1
    score_micro_batch: int = 0  # 0: the whole rollout in one scoring forward
    # Validation accuracy (greedy, through the generator) before every val_every-th step and
    # the last one; 0: off. val_prompts caps the validation problems (0: the whole split).
    val_every: int = 0
    val_prompts: int = 0


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "zkl"
    entity: str | None = None
    group: str | None = None  # null: derived from the config axes
    tags: list[str] = field(default_factory=list)  # added to the derived axis tags
    fallback: str = "none"  # none | offline: log offline when online cannot start


@dataclass
class TrackingConfig:
    dump_tokens: str = "4"  # per-token records of the first N samples per step, or "all"
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class CertConfig:
    """The bed axes: null certifies the config's own group; a list, one bed per option."""

    steps: int = 0  # 0: step-0 certification; N (>= 2): N real GRPO steps per bed
    ablate: bool = False
    models: list[str] | None = None
    precisions: list[str] | None = None
    layouts: list[str] | None = None
    kv: list[str] | None = None


@dataclass
class CheckpointConfig:
    every: int = 10  # save every N steps (0: only after the last step and on a stop signal)
    save: bool = True  # false: never write checkpoint.pt (cert beds, benchmarks); no resume


@dataclass
class FixesConfig:
    """null: follow `zero_train_gen_mismatch`; true/false: force one fix."""

    batch_invariant_gemm: bool | None = None
    batch_invariant_reductions: bool | None = None
    attention_fixed_split: bool | None = None
    logprob_path: bool | None = None
    moe_combine_order: bool | None = None
    mamba_chunked_decode: bool | None = None
    kv_invalidate_on_refit: bool | None = None
    refit_exactness: bool | None = None
    quantized_weight_refresh: bool | None = None


@dataclass
class BenchConfig:
    """`python -m zkl.bench` on CUDA: the short table, or RL shapes (PROMPTxRESPONSExROLLOUTS)."""

    workload: str = "short"  # short (zkl.bench_cuda's table) | rl (zkl.bench_rl)
    gen_shapes: list[str] = field(
        default_factory=lambda: [
            "1024x1024x64", "1024x4096x64", "4096x1024x64", "4096x4096x64",
            "1024x1024x256", "4096x1024x256",
        ]
    )  # fmt: skip
    step_shapes: list[str] = field(default_factory=lambda: ["4096x4096x64"])


@dataclass
class ZklConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cert: CertConfig = field(default_factory=CertConfig)
    fixes: FixesConfig = field(default_factory=FixesConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    resume: bool = False  # continue from run_dir/checkpoint.pt (zkl/checkpoint.py)
    zero_train_gen_mismatch: bool = True
    seed: int = 0
    device: str = "cpu"  # cpu (the embedded default) | cuda | cuda:N | auto (CUDA when present)
    num_threads: int = 0  # 0: torch's default; the dedicated generator uses the same number


def _check_bench(bench: BenchConfig, on_cuda: bool) -> None:
    if bench.workload not in ("short", "rl"):
        raise ConfigError(f"bench.workload={bench.workload!r} must be short or rl.")
    if bench.workload == "rl" and not on_cuda:
        raise ConfigError("bench.workload=rl times long CUDA workloads; use device=cuda.")
    for key in ("gen_shapes", "step_shapes"):
        for shape in getattr(bench, key):
            parts = str(shape).lower().split("x")
            if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ConfigError(
                    f"bench.{key} holds {shape!r}; each shape is PROMPTxRESPONSExROLLOUTS, "
                    "e.g. 4096x4096x64."
                )
            if int(parts[0]) <= 32 or int(parts[2]) % 8:
                raise ConfigError(
                    f"bench.{key} holds {shape!r}: the prompt must be over 32 tokens (the "
                    "residue task's prefix) and the rollouts a multiple of 8."
                )


def layout_gpus(layout: str, backend: str = "auto") -> int:
    """GPUs a run needs on a GPU device: one, or two for a generator on its own GPU (nccl).

    A dedicated generator with the default backend shares the trainer's GPU (CUDA IPC).
    """
    return 2 if layout == "dedicated" and backend == "nccl" else 1


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="zkl_schema", node=ZklConfig)
    # conf/hydra/launcher/slurm_gpu.yaml asks Slurm for zkl_gpus(layout.name, layout.backend).
    OmegaConf.register_new_resolver("zkl_gpus", layout_gpus, replace=True)


register_configs()


def to_object(cfg: DictConfig, overrides: list[str] | None = None) -> ZklConfig:
    """The typed config; a key the schema lacks (added with `+`) is refused, not dropped.

    `model.checkpoint` without a model group fills the model from its config.json
    (zkl/config_checkpoint.py); `overrides` default to the running Hydra job's.
    """
    reject_unknown_keys(cfg)
    if overrides is None:
        overrides = hydra_overrides()
    return resolve_checkpoint(OmegaConf.to_object(cfg), overrides, CONF_DIR)


def compose(overrides: list[str] | None = None) -> ZklConfig:
    """The config `python -m zkl <overrides>` would run with (for tests and scripts)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        normalized = normalize(list(overrides or []))
        return to_object(hydra_compose("config", overrides=normalized), normalized)


def load_group_option(cfg: ZklConfig, group: str, option: str) -> ZklConfig:
    """`cfg` with its `group` replaced by the schema defaults and `conf/<group>/<option>.yaml`."""
    path = os.path.join(CONF_DIR, group, f"{option}.yaml")
    if not os.path.exists(path):
        choices = sorted(p[:-5] for p in os.listdir(os.path.join(CONF_DIR, group)))
        raise ConfigError(
            f"{group}={option!r} is not an option of conf/{group}; pick one of {choices}."
        )
    base = OmegaConf.structured(cfg)
    base[group] = OmegaConf.merge(
        OmegaConf.structured(type(getattr(cfg, group))), OmegaConf.load(path)
    )
    return OmegaConf.to_object(base)


# The key that names a group's option (`model=tiny_moe` sets model.name; `kv=persist` kv.mode).
OPTION_KEY = {"model": "name", "precision": "name", "layout": "name", "kv": "mode"}


def with_group_option(cfg: ZklConfig, group: str, option: str) -> ZklConfig:
    """`cfg` with `conf/<group>/<option>.yaml` as its `group`, keeping the user's own edits.

    An edit is a key of the group whose value differs from the YAML of the user's option
    (e.g. `model.num_hidden_layers=4`); it holds for every option, as it would with
    `python -m zkl <group>=<option>` and the same overrides. How cert builds its beds.
    """
    user = getattr(cfg, group)
    try:
        stock = getattr(load_group_option(cfg, group, getattr(user, OPTION_KEY[group])), group)
    except ConfigError:  # a group built by hand on the command line: edits of the schema
        stock = type(user)()
    edits = {
        f.name: getattr(user, f.name)
        for f in fields(user)
        if f.name != OPTION_KEY[group] and getattr(user, f.name) != getattr(stock, f.name)
    }
    bed = load_group_option(cfg, group, option)
    return replace(bed, **{group: replace(getattr(bed, group), **edits)})


def _positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value} must be positive.")


def validate(
    cfg: ZklConfig, vocab_needed: int | None = None, positions_needed: int | None = None
) -> None:
    """Stop a config that cannot work before any work starts, naming the key to change."""
    check_values(cfg)  # first: a NaN or a huge integer passes every comparison below
    try:
        validate_model(cfg.model)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.precision.compute_dtype not in ("bfloat16", "float32"):
        raise ConfigError(
            f"precision.compute_dtype={cfg.precision.compute_dtype!r} must be bfloat16 or float32."
        )
    if cfg.precision.linear_quant not in ("none", "mxfp8", "fp8_tensor"):
        raise ConfigError(
            f"precision.linear_quant={cfg.precision.linear_quant!r} must be none, mxfp8 or "
            "fp8_tensor."
        )
    if cfg.precision.native:
        raise ConfigError(
            "precision.native=true needs Transformer Engine's MXFP8 GEMMs on a Blackwell GPU, "
            "which this machine lacks; set precision.native=false to use the exact emulation."
        )
    if cfg.precision.linear_quant == "mxfp8":
        layers = range(cfg.model.num_hidden_layers)
        dense = any(not cfg.model.layer_is_moe(i) for i in layers)
        for key in ("hidden_size", "intermediate_size") if dense else ("hidden_size",):
            if getattr(cfg.model, key) % 32:
                raise ConfigError(f"model.{key} must be a multiple of 32 for precision=mxfp8.")
        if cfg.model.is_moe and cfg.model.moe_intermediate_size % 32:
            raise ConfigError("model.moe_intermediate_size must be a multiple of 32 for mxfp8.")
        if cfg.model.family == "nemotron_h":  # out_proj and the shared expert's down_proj
            if cfg.model.mamba_num_heads * cfg.model.mamba_head_dim % 32:
                raise ConfigError(
                    "model.mamba_num_heads * model.mamba_head_dim must be a multiple of 32."
                )
            if cfg.model.moe_shared_expert_intermediate_size % 32:
                raise ConfigError(
                    "model.moe_shared_expert_intermediate_size must be a multiple of 32."
                )
        heads = cfg.model.num_attention_heads * cfg.model.head_dim
        if heads % 32:
            raise ConfigError(
                "model.num_attention_heads * model.head_dim must be a multiple of 32."
            )
    if cfg.layout.name not in ("colocated", "dedicated"):
        raise ConfigError(f"layout.name={cfg.layout.name!r} must be colocated or dedicated.")
    problem = check_device(cfg.device)
    if problem:
        raise ConfigError(problem)
    on_cuda = resolve_device(cfg.device).type == "cuda"
    if cfg.layout.backend not in ("auto", "gloo", "cuda_ipc", "nccl"):
        raise ConfigError(
            f"layout.backend={cfg.layout.backend!r} must be auto, gloo, cuda_ipc or nccl."
        )
    generator_device(cfg)  # raises the sentence for a backend / GPU combination that cannot run
    if cfg.layout.backend == "cuda_ipc" and not on_cuda:
        raise ConfigError("layout.backend=cuda_ipc needs device=cuda; use gloo on the CPU.")
    if cfg.layout.backend == "gloo" and on_cuda and cfg.layout.name == "dedicated":
        raise ConfigError(
            "layout.backend=gloo would copy CUDA weights through the host; use "
            "layout.backend=cuda_ipc (or auto) with device=cuda."
        )
    if cfg.engine.name not in ("native", *ENGINES):
        raise ConfigError(
            f"engine.name={cfg.engine.name!r} is not an engine; use one of {['native', *ENGINES]}."
        )
    problem = engine_problem(
        cfg.engine.name, cfg.layout.name, on_cuda, cfg.model.family, cfg.precision.linear_quant
    )
    if problem:
        raise ConfigError(problem)
    if cfg.kv.mode not in ("recompute", "persist"):
        raise ConfigError(f"kv.mode={cfg.kv.mode!r} must be recompute or persist.")
    _check_bench(cfg.bench, on_cuda)
    _positive(cfg.engine.max_batch_size, "engine.max_batch_size")
    if cfg.engine.sync_every < 0:
        raise ConfigError(f"engine.sync_every={cfg.engine.sync_every} must be >= 0 (0: auto).")
    graphs = graph_setting(cfg.engine.cuda_graphs)
    if graphs not in GRAPH_SETTINGS:
        raise ConfigError(f"engine.cuda_graphs={cfg.engine.cuda_graphs!r} must be auto, on or off.")
    if graphs == "on" and not on_cuda:
        raise ConfigError("engine.cuda_graphs=on needs device=cuda; use auto or off on the CPU.")
    if cfg.engine.prefill_chunk < 0:
        raise ConfigError(f"engine.prefill_chunk={cfg.engine.prefill_chunk} must be >= 0.")
    _positive(cfg.engine.prefix_cache_blocks, "engine.prefix_cache_blocks")
    _positive(cfg.sampling.temperature, "sampling.temperature")
    if not 0 < cfg.sampling.top_p <= 1:
        raise ConfigError(f"sampling.top_p={cfg.sampling.top_p} must be in (0, 1].")
    if cfg.sampling.top_k < 0:
        raise ConfigError(f"sampling.top_k={cfg.sampling.top_k} must be >= 0 (0 is off).")
    _positive(cfg.sampling.max_new_tokens, "sampling.max_new_tokens")
    for key in ("steps", "prompts_per_step", "samples_per_prompt", "lr", "num_minibatches"):
        _positive(getattr(cfg.rl, key), f"rl.{key}")
    if cfg.rl.score_micro_batch < 0:
        raise ConfigError(f"rl.score_micro_batch={cfg.rl.score_micro_batch} must be >= 0.")
    if cfg.rl.clip_eps <= 0 or cfg.rl.grad_clip <= 0 or cfg.rl.kl_coef < 0:
        raise ConfigError("rl.clip_eps and rl.grad_clip must be positive and rl.kl_coef >= 0.")
    if cfg.task.modulus < 2:
        raise ConfigError(f"task.modulus={cfg.task.modulus} must be >= 2.")
    if not 1 <= cfg.task.min_prompt_len <= cfg.task.max_prompt_len:
        raise ConfigError(
            "task.min_prompt_len and task.max_prompt_len must satisfy 1 <= min <= max."
        )
    if cfg.task.max_operand < 0 or cfg.task.max_operand > 9:
        raise ConfigError(f"task.max_operand={cfg.task.max_operand} must be between 0 and 9.")
    if cfg.tracking.wandb.mode not in ("offline", "online", "disabled"):
        raise ConfigError(
            f"tracking.wandb.mode={cfg.tracking.wandb.mode!r} must be offline, online or disabled."
        )
    from zkl.tracking.wandb_run import online_problem

    problem = online_problem(cfg.tracking.wandb)
    if problem:
        raise ConfigError(problem)
    if cfg.cert.steps < 0:
        raise ConfigError(f"cert.steps={cfg.cert.steps} must be >= 0.")
    if cfg.num_threads < 0:
        raise ConfigError(f"num_threads={cfg.num_threads} must be >= 0 (0: torch's default).")
    check_limits(cfg)
    check_trainer(cfg)
    positions_needed = positions_needed or default_positions(cfg)
    if vocab_needed is not None and cfg.model.vocab_size < vocab_needed:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the task tokenizer's "
            f"{vocab_needed} tokens; raise model.vocab_size."
        )
    if cfg.model.max_position_embeddings < positions_needed:
        raise ConfigError(
            f"model.max_position_embeddings={cfg.model.max_position_embeddings} is shorter than "
            f"the {positions_needed} positions a prompt plus sampling.max_new_tokens needs."
        )
    if cfg.model.checkpoint:
        check_checkpoint(cfg.model)
    check_memory(cfg, positions_needed)
    assert set(FIXES) <= set(vars(FixesConfig())), "every registered fix needs a fixes.<name> key"
