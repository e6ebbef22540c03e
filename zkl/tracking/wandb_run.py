"""Starting the W&B run: offline by default; online only with a key and a reachable server.

An online run without an API key is refused before any work (`online_problem`, called by
`validate`). With a key, `wandb.init` waits at most `WANDB_INIT_TIMEOUT` seconds (30 unless
set) for the server; when it cannot start, the run stops in one sentence, or logs offline
when the user asked for that (`tracking.wandb.fallback=offline`).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from zkl.console import say
from zkl.errors import RunFault

DEFAULT_BASE_URL = "https://api.wandb.ai"
INIT_TIMEOUT_S = "30"  # wandb's own default waits 90 s, then prints a traceback
FALLBACKS = ("none", "offline")
QUIET_ENV = {
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",
}


def base_url() -> str:
    return os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL


def has_api_key() -> bool:
    """A key in WANDB_API_KEY, or in the netrc file for the W&B host (`wandb login`)."""
    if os.environ.get("WANDB_API_KEY", "").strip() or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(urlparse(base_url()).hostname or "")
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def online_problem(wb: Any) -> str | None:
    """Why this W&B setting cannot start, found before any work; None when it can."""
    if wb.fallback not in FALLBACKS:
        return f"tracking.wandb.fallback={wb.fallback!r} must be none or offline."
    if wb.mode == "online" and not has_api_key() and wb.fallback != "offline":
        return (
            "tracking.wandb.mode=online needs a W&B API key: set WANDB_API_KEY (or run "
            "`wandb login`), or use tracking.wandb.mode=offline (or "
            "tracking.wandb.fallback=offline to log offline when online cannot start)."
        )
    return None


def start(cfg: Any, run_dir: Path, config: dict, wandb_id: str | None, group: str, tags: list):
    """The W&B run of this zkl run, or None when tracking.wandb.mode=disabled."""
    wb = cfg.tracking.wandb
    if wb.mode == "disabled":
        return None
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S)
    import wandb

    mode = wb.mode
    if mode == "online" and not has_api_key():  # fallback=offline (else validate refused)
        say("zkl: no W&B API key; logging offline (tracking.wandb.fallback)")
        mode = "offline"
    kwargs = dict(
        project=wb.project,
        entity=wb.entity,
        group=group,
        tags=tags,
        config=config,
        dir=str(run_dir),
        id=wandb_id,
        resume="allow" if wandb_id else None,
        settings=wandb.Settings(init_timeout=float(os.environ["WANDB_INIT_TIMEOUT"])),
    )
    try:
        return wandb.init(mode=mode, **kwargs)
    except Exception as err:
        if mode != "online":
            raise
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if wb.fallback == "offline":
            say(
                f"zkl: W&B online could not start ({reason}); logging offline "
                "(tracking.wandb.fallback=offline)"
            )
            return wandb.init(mode="offline", **kwargs)
        raise RunFault(
            f"W&B online could not start at {base_url()} within WANDB_INIT_TIMEOUT="
            f"{os.environ['WANDB_INIT_TIMEOUT']} s ({reason}); check the network or "
            "WANDB_BASE_URL, or set tracking.wandb.mode=offline (or "
            "tracking.wandb.fallback=offline)."
        ) from None


def sync_hint(run: Any) -> str | None:
    """The line that says where an offline W&B run lies and how to upload it (its directory
    under the run's `wandb/`); None for an online run."""
    if not run.offline:
        return None
    where = run.settings.sync_dir
    return f"zkl: W&B logged offline to {where}; upload it with: wandb sync {where}"
