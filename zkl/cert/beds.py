"""The beds a certification runs: the user's config varied along `cert.models`,
`cert.precisions`, `cert.layouts` and `cert.kv`, each with its ablation runs, every one
checked before any runs, and the folder each one's metrics land in."""

from __future__ import annotations

import dataclasses
import itertools
import operator
import re
from pathlib import Path

from zkl import environment, invariance
from zkl.cert import ablation
from zkl.cert.ablation import Mode
from zkl.cert.certify import check
from zkl.cert.config import check_cert
from zkl.cert.schema import CertRunConfig
from zkl.errors import ConfigError
from zkl.run.compose import with_group_option

AXES = {"model": "models", "precision": "precisions", "layout": "layouts", "kv": "kv"}


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


def bed_name(cfg: CertRunConfig) -> str:
    """`model/layout/precision/kv_mode[/wsN]`: a path under the run directory, checked part
    by part; a sharded trainer's world size is its own level."""
    parts = [folder_name(operator.attrgetter(k)(cfg), k) for k in FOLDER_KEYS]
    ranks = f"/ws{cfg.trainer.world_size}" if cfg.trainer.world_size > 1 else ""
    return "{}/{}/{}/kv_{}".format(*parts) + ranks


def beds(cfg: CertRunConfig) -> list[CertRunConfig]:
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


@dataclasses.dataclass
class Run:
    """One run of the plan: a bed, all fixes on in an ablation mode, or one fix off."""

    bed: str
    kind: str  # "bed" | "reference" | "ablation"
    mode: Mode
    cfg: CertRunConfig
    fix: str | None = None  # the fix an ablation run turns off
    reference: CertRunConfig | None = None  # what an ablation run is judged against
    refused: str | None = None  # why this machine cannot run an ablation mode of the bed

    @property
    def variant(self) -> str:
        return invariance.label(invariance.from_config(self.cfg))


def plan(cfg: CertRunConfig) -> list[Run]:
    """Every run, each reference before the runs judged against it; all checked up front."""
    check_cert(cfg.cert)
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


def bed_dir(run_dir: Path, run: Run) -> Path:
    """Where a run's metrics land; never outside `run_dir` (each part was checked in plan)."""
    parts = [run.bed, folder_name(str(run.mode), "cert.steps"), folder_name(run.variant, "fixes")]
    path = run_dir / "beds" / Path(*parts)
    assert path.resolve().is_relative_to(run_dir.resolve()), path
    return path
