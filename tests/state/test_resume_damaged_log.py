"""Resume over a damaged metrics.jsonl: dropped lines are named and the history is bitwise the
uninterrupted one, or the resume is refused in one sentence; a step is logged with its token
records or not at all."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import make_cfg
from tests.state.test_resume import TINY, assert_same_run
from zkl.errors import ConfigError, RunFault
from zkl.rl.loop import run
from zkl.state import resume_logs
from zkl.tracking.run_log import METRICS_FILE, TOKENS_FILE, RunLog


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    run(make_cfg("rl.steps=4", *TINY), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """3 steps: metrics rows 0..2, checkpoint at 3."""
    run_dir = tmp_path_factory.mktemp("saved")
    run(make_cfg("rl.steps=3", *TINY), run_dir)
    return run_dir


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    shutil.copytree(saved, tmp_path / "run")
    return tmp_path / "run"


def edit_lines(path: Path, edit) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda ls: ls[:1] + ["\n", "  \n"] + ls[1:], "dropped 2 blank lines"),
        (lambda ls: ls[:2] + ["garbage{\n"] + ls[2:], "dropped line 3 (not a row)"),
        (lambda ls: ls[:2] + ['{"a": 1}\n'] + ls[2:], "dropped line 3 (not a row)"),
        (lambda ls: ls[:2] + ['{"step": "1"}\n'] + ls[2:], "dropped line 3 (not a row)"),
        (lambda ls: ls[:2] + ls[1:], "dropped 1 repeated row"),
        (lambda ls: [*ls, ls[0]], "dropped 1 repeated row"),
        (
            lambda ls: [*ls, '{"step": 7}\n'],
            "dropped 1 row of step 7, logged after the checkpoint.pt of step 3: the run "
            "continues from step 3",
        ),
        (lambda ls: [*ls, '{"step": 3, "x'], "dropped a torn last line"),
    ],
)
def test_a_damaged_log_is_trimmed_says_so_and_resumes_bitwise(copy, reference, capfd, edit, said):
    edit_lines(copy / METRICS_FILE, edit)
    rows = run(make_cfg("rl.steps=4", "resume=true", *TINY), copy)
    err = capfd.readouterr().err
    assert f"zkl: {copy / METRICS_FILE}: {said}" in err, err
    assert "Traceback" not in err and "missing" not in err and "lacks" not in err
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert_same_run(copy, reference)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (
            lambda ls: [ls[0], "garbage\n", ls[2]],
            "no complete row for step 1 (line 2 is not a row)",
        ),
        (lambda ls: [ls[0], "\n", ls[2]], "no complete row for step 1, but"),
        (lambda ls: ls[:2], "no complete row for step 2, but"),
    ],
)
def test_a_step_the_checkpoint_covers_without_its_row_is_refused(copy, edit, fragment):
    edit_lines(copy / METRICS_FILE, edit)
    before = (copy / METRICS_FILE).read_text()
    with pytest.raises(ConfigError) as err:
        run(make_cfg("rl.steps=4", "resume=true", *TINY), copy)
    message = str(err.value)
    assert message.startswith(f"{copy / METRICS_FILE} has ") and fragment in message, message
    assert message.endswith(
        "delete the checkpoint to rerun from step 0 with resume=true, "
        "or start afresh in another hydra.run.dir."
    )
    assert (copy / METRICS_FILE).read_text() == before  # a refusal rewrites nothing


def test_two_different_rows_for_one_step_are_refused(copy):
    def conflicting(lines):
        other = {**json.loads(lines[1]), "reward/mean": 123.0}
        return [*lines[:2], json.dumps(other) + "\n", *lines[2:]]

    edit_lines(copy / METRICS_FILE, conflicting)
    with pytest.raises(ConfigError, match=r"two different rows for step 1 \(lines 2 and 3\)"):
        run(make_cfg("rl.steps=4", "resume=true", *TINY), copy)


def test_token_records_of_a_step_without_its_row_are_dropped(copy, reference):
    """A kill between the token records (written first) and the row leaves records alone."""
    extra = [json.dumps({"step": 3, "sample": 0, "response": [1]}) + "\n"] * 2
    edit_lines(copy / TOKENS_FILE, lambda ls: ls + extra)
    run(make_cfg("rl.steps=4", "resume=true", *TINY), copy)
    assert_same_run(copy, reference)


@pytest.mark.parametrize(
    "steps, next_step, said",
    [
        (
            [0, 1, 2, 3, 4],
            3,
            "2 rows of steps 3-4, logged after the checkpoint.pt of step 3: the run continues "
            "from step 3",
        ),
        ([0, 1], 0, "2 rows of steps 0-1: no checkpoint.pt holds them, so the run starts again"),
        ([0, 2, 5, 7], 1, "3 rows of steps 2, 5, 7, logged after the checkpoint.pt of step 1"),
    ],
)
def test_rows_after_the_checkpoint_are_named_by_step(tmp_path, steps, next_step, said):
    """Not `dropped 2 row of step 0 or laters`: how many, which steps, and why."""
    (tmp_path / METRICS_FILE).write_text("".join(f'{{"step": {s}}}\n' for s in steps))
    scan = resume_logs.scan_jsonl(tmp_path / METRICS_FILE, next_step, one_per_step=True)
    assert scan.changed and scan.notes == [scan.notes[0]] and scan.notes[0].startswith(said)
    records = resume_logs.scan_jsonl(tmp_path / METRICS_FILE, next_step, one_per_step=False)
    assert records.notes[0].startswith(said.replace("rows", "records"))


def test_a_failed_row_write_cuts_back_the_step_s_token_records(tmp_path, monkeypatch):
    log = RunLog(tmp_path, make_cfg())
    log.log(0, {"a": 1.0}, [{"step": 0, "sample": 0}])
    sizes = {name: (tmp_path / name).stat().st_size for name in (METRICS_FILE, TOKENS_FILE)}
    real_write = os.write

    def metrics_disk_full(fd, data):
        if fd == log._metrics:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", metrics_disk_full)
    with pytest.raises(RunFault, match="cannot write metrics.jsonl"):
        log.log(1, {"a": 2.0}, [{"step": 1, "sample": 0}, {"step": 1, "sample": 1}])
    monkeypatch.setattr(os, "write", real_write)
    log.close()
    for name, size in sizes.items():  # neither file holds anything of step 1
        assert (tmp_path / name).stat().st_size == size, name
    scan = resume_logs.scan_jsonl(tmp_path / TOKENS_FILE, 2, one_per_step=False)
    assert scan.steps() == {0} and not scan.changed
