"""`ZklConfig`: the parts' config dataclasses under one root, the schema of conf/config.yaml.

Each group's dataclass lives in the part that reads it; this module only composes them, so
a misspelt key fails with Hydra's own error (and one added with `+`, in `to_object`). The
certificate and the benchmark extend it with their own keys (`zkl.cert.schema`: `cert.*`;
`zkl.lab.schema`: `bench.*`);
a training run knows nothing of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.data.config import TaskConfig
from zkl.distributed.config import TrainerConfig
from zkl.engines import EngineConfig
from zkl.generation.config import KVConfig, SamplingConfig, SchedulerConfig
from zkl.invariance import FixesConfig
from zkl.layouts.config import LayoutConfig
from zkl.models.config import ModelConfig
from zkl.precision.config import PrecisionConfig
from zkl.resources import conf_dir
from zkl.rl.config import RLConfig
from zkl.state.config import CheckpointConfig
from zkl.tracking.config import TrackingConfig

CONF_DIR = conf_dir()  # the group options (YAML), in a checkout or an installed wheel


@dataclass
class ZklConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    fixes: FixesConfig = field(default_factory=FixesConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    resume: bool = False  # continue from run_dir/checkpoint.pt (zkl/state/checkpoint.py)
    zero_train_gen_mismatch: bool = True
    seed: int = 0
    device: str = "cpu"  # cpu (the embedded default) | cuda | cuda:N | auto (CUDA when present)
    # CPU threads; 0: one on a CPU run, torch's default on CUDA (zkl/threads.py says why).
    # A dedicated generator uses the same number.
    num_threads: int = 0
