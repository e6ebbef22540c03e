"""Process and disk faults end in one line and a known exit code, never a traceback or a hang.

The generation process dying (at start-up, in the rendezvous, mid-run, or with an error),
Ctrl-C (once: the step finishes and is saved; twice: the step in flight is abandoned), a full
disk, an unwritable run directory, and a metrics file torn by a killed writer.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl.errors import RunFault
from zkl.layouts.dedicated import STDERR_FILE
from zkl.state.config import CHECKPOINT_FILE
from zkl.tracking import run_log
from zkl.tracking.run_log import METRICS_FILE, RunLog, read_metrics

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parent.parent
QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]
FAST = ["rl.prompts_per_step=2", "rl.samples_per_prompt=2"]


def heed_sigint() -> None:
    """In the child before it runs: Ctrl-C's default action, as a terminal's command has it. A
    test run started as a background job ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], run_dir: Path, stderr=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}
    cmd = [sys.executable, "-m", "zkl", *QUIET, *FAST, *args, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        cmd,
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
        preexec_fn=heed_sigint,
    )


def generation_child(pid: int, deadline_s: float = 120) -> int:
    """The pid of the dedicated generator (the spawned child of `pid`), once it exists."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"spawn_main" in cmdline:
                return int(entry)
        time.sleep(0.02)
    raise AssertionError("the generation process never started")


def ignores_sigint(pid: int) -> bool:
    """Whether process `pid` ignores SIGINT now (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"/proc/{pid}/status has no SigIgn line")


def wait_for_step(proc: subprocess.Popen, run_dir: Path, deadline_s: float = 180) -> None:
    end = time.monotonic() + deadline_s
    metrics = run_dir / METRICS_FILE
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < end, "no step was logged"
        time.sleep(0.1)


def finish(proc: subprocess.Popen, since: float) -> tuple[list[str], float]:
    """stderr lines (non-blank) and seconds from `since` to the exit."""
    _, err = proc.communicate(timeout=60)
    return [x for x in err.splitlines() if x.strip()], time.monotonic() - since


def test_generator_killed_mid_run_is_reported_in_seconds(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["+layout=dedicated", "rl.steps=500"], run_dir)
    wait_for_step(proc, run_dir)
    os.kill(generation_child(proc.pid), signal.SIGKILL)
    lines, seconds = finish(proc, time.monotonic())
    assert proc.returncode == 1 and seconds < 15
    assert lines == [
        f"zkl: the generation process was killed by signal SIGKILL; its stderr is in "
        f"{run_dir / 'generator_stderr.log'}."
    ]
    assert len(read_metrics(run_dir)) >= 1


def test_generator_killed_at_start_up_is_reported_in_seconds(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["+layout=dedicated", "layout.timeout_s=600"], run_dir)
    os.kill(generation_child(proc.pid), signal.SIGKILL)
    lines, seconds = finish(proc, time.monotonic())
    assert proc.returncode == 1 and seconds < 15, lines
    assert len(lines) == 1 and "killed by signal SIGKILL" in lines[0]
    assert (run_dir / METRICS_FILE).read_text() == ""


def test_generator_dying_in_the_rendezvous_names_its_exit_code(tmp_path):
    """The trainer is inside init_process_group when the child exits with code 3."""
    script = [sys.executable, str(REPO / "tests" / "helpers" / "fault_workers.py")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [*script, "exit_during_rendezvous", str(tmp_path)], env=env, capture_output=True, text=True
    )
    seconds, message = out.stdout.strip().split(" ", 1)
    assert float(seconds) < 30, "waited for layout.timeout_s (600 s) instead of the sentinel"
    assert message == (
        f"the generation process died with exit code 3; its stderr is in "
        f"{tmp_path / 'generator_stderr.log'} (last: fault_workers: exiting during the "
        "rendezvous)."
    )


def test_generator_error_is_one_sentence_with_its_traceback_kept(tmp_path):
    from zkl.layouts.dedicated import DedicatedGenerator

    cfg = make_cfg("+layout=dedicated", "precision.linear_quant=bogus")  # fails in the child
    with pytest.raises(RunFault) as err:
        DedicatedGenerator(cfg, eos_id=1, run_dir=tmp_path)
    message = str(err.value)
    assert message.startswith("the generation process failed with ValueError: ")
    assert message.endswith(f"its stderr is in {tmp_path / 'generator_stderr.log'}.")
    assert "Traceback" in (tmp_path / "generator_stderr.log").read_text()
    import torch.distributed as dist

    assert not dist.is_initialized()  # the failed start cleaned up after itself


def saved_step(run_dir: Path) -> int:
    return torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["step"]


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_ctrl_c_finishes_the_step_saves_and_says_how_to_resume(tmp_path, layout):
    """With checkpoint.every=10, Ctrl-C after a step or two still leaves a checkpoint of
    every logged step: the step in flight finishes, is logged and saved, the run exits 130."""
    run_dir = tmp_path / "run"
    proc = start([f"+layout={layout}", "rl.steps=500"], run_dir)
    wait_for_step(proc, run_dir)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the generator gets it too
    lines, _ = finish(proc, time.monotonic())
    assert proc.returncode == 130, lines
    logged = len(read_metrics(run_dir))
    assert saved_step(run_dir) == logged
    last = logged - 1
    steps = "step 0 is" if logged == 1 else f"steps 0-{last} are"
    assert lines == [
        f"zkl: SIGINT: finishing step {last}, then saving and stopping (Ctrl-C again stops at "
        "once, without it).",
        f"zkl: stopped by SIGINT; {steps} logged and saved: resume=true "
        f"hydra.run.dir={run_dir} continues from step {logged}.",
    ]
    text = (run_dir / METRICS_FILE).read_text()
    assert text.endswith("\n") and all(json.loads(x) for x in text.splitlines())
    time.sleep(0.5)
    with pytest.raises(AssertionError):  # the generation process went with it
        generation_child(proc.pid, deadline_s=0.2)


def test_ctrl_c_before_the_first_step_says_nothing_can_be_resumed(tmp_path):
    """Ctrl-C while the generation process starts: no step, no checkpoint, said so.

    Sent once the child runs its own code (its stderr file exists) and the trainer heeds
    Ctrl-C again: while the trainer starts the child it ignores SIGINT for the child to
    inherit, and a Ctrl-C in that window is dropped (a second one acts). On a loaded machine
    the child can write its file before the trainer leaves the window."""
    run_dir = tmp_path / "run"
    proc = start(["+layout=dedicated", "layout.timeout_s=600"], run_dir)
    generation_child(proc.pid)
    end = time.monotonic() + 120
    while time.monotonic() < end and not (
        (run_dir / STDERR_FILE).exists() and not ignores_sigint(proc.pid)
    ):
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    lines, _ = finish(proc, time.monotonic())
    assert proc.returncode == 130, lines
    assert lines == [
        "zkl: interrupted; no step is logged and no checkpoint.pt is saved: nothing can be resumed."
    ]
    time.sleep(0.5)
    with pytest.raises(AssertionError):  # the generation process went with it
        generation_child(proc.pid, deadline_s=0.2)


def stalling_task(run_dir: Path, stall_at: int) -> list[str]:
    """The overrides of the task whose reward call `stall_at` stalls (once: fault_workers)."""
    return [
        "task._target_=fault_workers:StallingAddTask",
        f"+task.params.stall_at={stall_at}",
        f"+task.params.marker={run_dir.parent / 'stalled'}",
    ]


def stall_then(run_dir: Path, args: list[str], stall_at: int) -> tuple[subprocess.Popen, Path]:
    """A run of the stalling task, once it stalls; its stderr goes to a file, read meanwhile."""
    marker, err = run_dir.parent / "stalled", run_dir.parent / "stderr.txt"
    with open(err, "w") as stderr:
        proc = start([*stalling_task(run_dir, stall_at), *args], run_dir, stderr=stderr)
    end = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < end, err.read_text()[-2000:]
        time.sleep(0.05)
    return proc, err


def ctrl_c_twice(proc: subprocess.Popen, err: Path) -> list[str]:
    """Ctrl-C, then once its line is out (the first is handled), Ctrl-C again."""
    os.killpg(proc.pid, signal.SIGINT)
    end = time.monotonic() + 60
    while "zkl: SIGINT: finishing step" not in err.read_text():
        assert proc.poll() is None and time.monotonic() < end, err.read_text()[-2000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    return [x for x in err.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_ctrl_c_twice_abandons_the_step_in_flight_and_says_nothing_can_be_resumed(tmp_path, layout):
    """The second Ctrl-C stops at once; step 1 (stalled in its reward) is abandoned: neither its
    row nor its token records are written. No checkpoint yet (every=10): the line says so."""
    run_dir = tmp_path / "run"
    proc, err = stall_then(run_dir, [f"+layout={layout}", "rl.steps=500"], stall_at=4)
    lines = ctrl_c_twice(proc, err)
    assert proc.returncode == 130, lines
    assert lines == [
        "zkl: SIGINT: finishing step 1, then saving and stopping (Ctrl-C again stops at once, "
        "without it).",
        "zkl: interrupted; step 1 is abandoned; step 0 is logged but no checkpoint.pt is saved "
        "(checkpoint.every=10): nothing can be resumed, and resume=true "
        f"hydra.run.dir={run_dir} starts again from step 0.",
    ]
    assert [r["step"] for r in read_metrics(run_dir)] == [0]
    tokens = (run_dir / "tokens.jsonl").read_text().splitlines()
    assert {json.loads(x)["step"] for x in tokens} == {0}
    assert not (run_dir / CHECKPOINT_FILE).exists()


def test_a_full_disk_mid_run_is_one_sentence(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / METRICS_FILE).symlink_to("/dev/full")  # every write: ENOSPC
    proc = start(["rl.steps=2"], run_dir)
    lines, _ = finish(proc, time.monotonic())
    assert proc.returncode == 1
    assert lines == [
        f"zkl: cannot write metrics.jsonl in hydra.run.dir={run_dir} (No space left on device); "
        "every step before is complete."
    ]


@pytest.mark.parametrize("where", ["below a file", "metrics.jsonl is a directory"])
def test_an_unwritable_run_dir_is_one_sentence(tmp_path, where):
    if where == "below a file":
        (tmp_path / "file").write_text("")
        run_dir = tmp_path / "file" / "run"
    else:
        run_dir = tmp_path / "run"
        (run_dir / METRICS_FILE).mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "zkl", *QUIET, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"zkl: hydra.run.dir={run_dir} cannot be written (")
    assert lines[0].endswith("choose another hydra.run.dir.")


def _log(tmp_path) -> RunLog:
    return RunLog(tmp_path, make_cfg(*SMALL))


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"), "interrupt"])
def test_a_failed_write_leaves_only_complete_lines(tmp_path, monkeypatch, fault):
    log = _log(tmp_path)
    log.log(0, {"a": 1.0})
    real_write = os.write

    def half_then_fault(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise KeyboardInterrupt if fault == "interrupt" else fault

    monkeypatch.setattr(run_log.os, "write", half_then_fault)
    with pytest.raises(KeyboardInterrupt if fault == "interrupt" else RunFault):
        log.log(1, {"a": 2.0, "long": "x" * 10_000})
    monkeypatch.undo()
    log.close()
    assert (tmp_path / METRICS_FILE).read_text() == '{"step": 0, "a": 1.0}\n'


def test_the_reader_skips_a_torn_last_line_and_the_writer_cuts_it(tmp_path):
    good = '{"step": 0, "a": 1.0}\n{"step": 1, "a": 2.0}\n'
    (tmp_path / METRICS_FILE).write_text(good + '{"step": 2, "a"')
    with pytest.warns(UserWarning, match="skipped a torn last line"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    with pytest.warns(UserWarning, match="cut a torn last line"):
        log = _log(tmp_path)
    log.log(2, {"a": 3.0})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    (tmp_path / METRICS_FILE).write_text('{"step": 0}\n{"ste\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_metrics(tmp_path)
