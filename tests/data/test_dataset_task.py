"""Your model, tokenizer and data: a transformers-written checkpoint alone sets the model, its
tokenizer reads and writes the texts, a dataset task trains with exact zero mismatch, and
every hostile input of this surface is one sentence before any model is built."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import QUIET, make_cfg
from tests.test_hostile_input import assert_refused_before_work, run_entry
from zkl.data.rewards import exact_match, math_answer
from zkl.data.tasks import build_task
from zkl.errors import ConfigError
from zkl.rl.loop import run
from zkl.run.validate import validate

pytestmark = pytest.mark.slow  # whole runs on datasets: `pytest -m "not slow"` skips them

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "testdata"
TRAIN, VAL = DATA / "arith_train.jsonl", DATA / "arith_val.jsonl"
_spec = importlib.util.spec_from_file_location(
    "make_hf", REPO / "scripts" / "make_hf_checkpoint.py"
)

make_hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_hf)

DATASET = [
    "task=dataset",
    f"task.path={TRAIN}",
    f"task.val_path={VAL}",
    "task.prompt_key=question",
    "sampling.max_new_tokens=4",
    "rl.prompts_per_step=4",
    "rl.samples_per_prompt=4",
]


def write_checkpoint(out: Path, family: str = "qwen2", shard: str | None = "100KB") -> Path:
    """transformers' save_pretrained of a tiny random model, and a BPE trained on the data."""
    make_hf.write_model(out, family, "tiny", seed=0, max_shard_size=shard)
    make_hf.write_tokenizer(out, make_hf.corpus_lines(str(TRAIN)), 320)
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_qwen2")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the model from the checkpoint alone -------------------------------------------------


def hf_config(family: str):
    """A tiny transformers config of every family zkl reads."""
    import transformers

    common = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    common |= dict(head_dim=16, intermediate_size=128, max_position_embeddings=512)
    if family == "qwen2":
        return transformers.Qwen2Config(num_hidden_layers=3, **common)
    if family == "qwen3":
        return transformers.Qwen3Config(num_hidden_layers=3, **common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            num_hidden_layers=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            **common,
        )
    return transformers.NemotronHConfig(
        hybrid_override_pattern="M*-E",
        mamba_num_heads=8,
        mamba_head_dim=8,
        ssm_state_size=16,
        n_groups=2,
        chunk_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        **common,
    )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe", "nemotron_h"])
def test_the_checkpoint_alone_sets_the_model(tmp_path, family):
    hf = hf_config(family)
    hf.save_pretrained(tmp_path / family)
    model = make_cfg(f"model.checkpoint={tmp_path / family}").model
    assert (model.family, model.name) == (family, family)
    assert (model.vocab_size, model.hidden_size, model.head_dim) == (96, 64, 16)
    assert model.num_hidden_layers == (4 if family == "nemotron_h" else 3 - (family == "qwen3_moe"))
    assert model.max_position_embeddings == 512 and model.checkpoint == str(tmp_path / family)
    if family == "qwen2":
        assert model.qkv_bias and not model.qk_norm
    if family == "qwen3_moe":
        assert (model.moe.num_experts, model.moe.num_experts_per_tok) == (4, 2)
    if family == "nemotron_h":
        assert model.hybrid_override_pattern == "M*-E" and model.mamba.num_heads == 8
    # The default group's (tiny_dense) numbers are all replaced: none leaks into the model.
    assert make_cfg().model.vocab_size == 64 and model.vocab_size == 96


def test_explicit_model_keys_must_agree(tmp_path):
    hf_config("qwen2").save_pretrained(tmp_path / "c")
    key = f"model.checkpoint={tmp_path / 'c'}"
    agreed = make_cfg(key, "model.hidden_size=64", "model.max_position_embeddings=128")
    assert agreed.model.max_position_embeddings == 128  # a shorter context is allowed
    assert make_cfg(key, "model.name=mine").model.name == "mine"
    for override, shown in [
        ("model.hidden_size=32", "hidden_size=64 in its config.json but model.hidden_size=32"),
        ("model.family=qwen3", "family='qwen2' in its config.json but model.family='qwen3'"),
        ("model.vocab_size=64", "model.vocab_size=64"),  # equal to tiny_dense's: still explicit
        ("model.max_position_embeddings=1024", "model.max_position_embeddings=1024"),
    ]:
        with pytest.raises(ConfigError) as err:
            make_cfg(key, override)
        assert shown in str(err.value) and "\n" not in str(err.value), str(err.value)
    # A named group is the user's claim about the architecture: checked, never replaced.
    with pytest.raises(ConfigError, match="use the model config of the checkpoint"):
        validate(make_cfg("model=tiny_dense", key))


def test_a_sharded_checkpoint_loads_every_shard(ckpt):
    from transformers import AutoModelForCausalLM

    from zkl.models.build import build_model
    from zkl.models.hf_checkpoint import to_hf

    assert (ckpt / "model.safetensors.index.json").is_file()
    assert len(list(ckpt.glob("model-*.safetensors"))) > 1
    cfg = make_cfg(f"model.checkpoint={ckpt}")
    validate(cfg)
    ours = to_hf(build_model(cfg.model, torch.float32, device="cpu").state_dict(), cfg.model)
    theirs = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).state_dict()
    for name, tensor in theirs.items():
        if name == "lm_head.weight":
            continue  # tied to the embedding
        assert torch.equal(ours[name.removeprefix("model.")], tensor), name


# --- the dataset run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset_run(ckpt, tmp_path_factory) -> Path:
    """`python -m zkl model.checkpoint=DIR task=dataset ...`: no model group named."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    args = [f"model.checkpoint={ckpt}", *DATASET, "task.chat_template=true", "rl.steps=3"]
    args += ["rl.val_every=2", "rl.val_prompts=8", "tracking.dump_tokens=all", *QUIET]
    out = run_entry("zkl", args, run_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def test_a_dataset_run_with_no_model_group_is_exactly_zero(dataset_run):
    rows = read_jsonl(dataset_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert row["train/gen_kl_error"] == 0.0 and row["train/max_abs_logprob_diff"] == 0.0
        assert row["train/bitwise_equal_frac"] == 1.0
    # validated before step 0, before every 2nd step and before the last: 0 and 2
    assert [("val/accuracy" in r) for r in rows] == [True, False, True]
    assert all(r["val/num_problems"] == 8 for r in rows if "val/accuracy" in r)
    assert all(0.0 <= r["val/accuracy"] <= 1.0 for r in rows if "val/accuracy" in r)
    config = (dataset_run / "config.yaml").read_text()
    assert "family: qwen2" in config and "vocab_size: 384" in config


def test_the_tokenizer_round_trips(dataset_run, ckpt):
    """Prompts re-encode to their ids; each response's text is the decode of its ids.

    A sampled response need not be the tokenizer's own segmentation of its text ("1", "2"
    where BPE would write "12"), so the ids stay the record; the text round-trips, and a
    response in the tokenizer's segmentation re-encodes to its ids exactly.
    """
    from zkl.data.tokenizer import HFTokenizer

    tok = HFTokenizer(ckpt, chat_template=True)
    records = read_jsonl(dataset_run / "tokens.jsonl")
    assert len(records) == 3 * 16
    canonical = 0
    for rec in records:
        assert tok.encode(rec["prompt_text"], special=False) == rec["prompt"]
        assert rec["prompt_text"].startswith("<|im_start|>user\n")
        assert rec["response_text"] == tok.decode(rec["response"])
        again = tok.encode(rec["response_text"], special=False)
        assert tok.decode(again) == rec["response_text"]
        canonical += again == rec["response"]
    assert canonical > 0
    # The tokenizer's own segmentation of every answer (and EOS) re-encodes to the same ids.
    for row in read_jsonl(VAL):
        ids = tok.encode(row["answer"]) + [tok.eos_id]
        assert tok.encode(tok.decode(ids), special=False) == ids
        assert tok.response_text(ids) == row["answer"]
    assert tok.eos_id == tok._tok.token_to_id("<|im_end|>")
    assert tok.pad_id == tok._tok.token_to_id("<|endoftext|>")


MATH_CASES = [
    ("12", "The answer is 12", 1.0),
    ("12", "\\boxed{12}", 1.0),
    ("12", "5 + 7 = 12.", 1.0),
    ("12", "12 apples", 1.0),
    ("12", "13", 0.0),
    ("12", "\\boxed{13}", 0.0),
    ("12", "", 0.0),
    ("12", "twelve", 0.0),
    ("\\frac{1}{2}", "0.5", 1.0),
    ("\\frac{1}{2}", "$\\frac{2}{4}$", 1.0),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", 0.0),
]


@pytest.mark.parametrize("answer,response,expected", MATH_CASES)
def test_the_math_reward_scores_known_answers(answer, response, expected):
    assert math_answer("q", response, answer) == expected


def test_the_exact_reward():
    assert exact_match("q", " 7\n", "7") == 1.0
    assert exact_match("q", "7.", "7") == 0.0


def test_a_user_reward_function_sets_the_rewards(ckpt, tmp_path):
    from user_rewards import digit_share

    cfg = make_cfg(
        f"model.checkpoint={ckpt}",
        *DATASET,
        "task.reward=user_rewards:digit_share",
        "rl.steps=2",
        "tracking.dump_tokens=all",
    )
    rows = run(cfg, tmp_path / "run", progress=False)
    task = build_task(cfg)
    records = read_jsonl(tmp_path / "run" / "tokens.jsonl")
    expected = [digit_share("", task.tokenizer.response_text(r["response"]), "") for r in records]
    assert [r["reward"] for r in records] == expected
    assert len(set(expected)) > 1  # not a constant the test would pass on by chance
    for step, row in enumerate(rows):
        mine = expected[16 * step : 16 * step + 16]
        assert row["reward/mean"] == pytest.approx(sum(mine) / 16, abs=1e-6)


def test_gsm8k_rows_on_a_random_model_score_zero_in_strict_mode(ckpt, tmp_path):
    """Random weights write noise; the strict reward reads the `#### N` line the template asks
    for, so every sample scores 0 (math-verify reads any last number)."""
    from zkl.data.rewards import gsm8k_strict

    gsm8k = DATA / "gsm8k_rows.jsonl"
    template = "task.prompt_template='{prompt} End with the line #### N.'"
    cfg = make_cfg(
        f"model.checkpoint={ckpt}",
        *[o for o in DATASET if not o.startswith("task.val_path")],
        f"task.path={gsm8k}",
        "task.reward=gsm8k",
        template,
        "sampling.max_new_tokens=8",
        "rl.steps=1",
        "tracking.dump_tokens=all",
    )
    run(cfg, tmp_path / "run", progress=False)
    task = build_task(cfg)
    records = read_jsonl(tmp_path / "run" / "tokens.jsonl")
    assert len(records) == 16 and all(r["reward"] == 0.0 for r in records)
    golds = {e.prompt_text: e.answer for e in task.train}
    for r in records:
        prompt = task.tokenizer.decode(r["prompt"])
        assert prompt.endswith("End with the line #### N.") and prompt in golds
        text = task.tokenizer.response_text(r["response"])
        assert gsm8k_strict(prompt, text, golds[prompt]) == r["reward"]


def test_a_user_task_class(ckpt, tmp_path):
    cfg = make_cfg(
        f"model.checkpoint={ckpt}",
        *DATASET,
        "task._target_=user_rewards:ParityTask",
        "+task.params.parity=1",
        "rl.steps=1",
        "tracking.dump_tokens=all",
    )
    run(cfg, tmp_path / "run", progress=False)
    records = read_jsonl(tmp_path / "run" / "tokens.jsonl")
    assert [r["reward"] for r in records] == [float(len(r["response"]) % 2) for r in records]


def test_validation_of_the_built_in_task(tmp_path):
    small = ["rl.steps=3", "rl.prompts_per_step=2", "rl.samples_per_prompt=4"]
    cfg = make_cfg(*small, "rl.val_every=2")
    rows = run(cfg, tmp_path / "run", progress=False)
    assert [r.get("val/num_problems") for r in rows] == [25, None, 25]
    assert all(r["train/gen_kl_error"] == 0.0 for r in rows)
    plain = run(make_cfg(*small), tmp_path / "plain", progress=False)
    for with_val, without in zip(rows, plain):  # validating never changes a training number
        for key, value in without.items():
            if not key.startswith(("timing/", "perf/", "gen/prefix_hit")):
                assert with_val[key] == value, key


# --- hostile input -----------------------------------------------------------------------


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        cfg = make_cfg(*overrides)
        validate(cfg)
        build_task(cfg)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_every_hostile_input_is_one_sentence(ckpt, tmp_path):
    base = [f"model.checkpoint={ckpt}", *DATASET]
    assert "task.path" in refused(*base, f"task.path={tmp_path}/none.jsonl")
    assert "task.path" in refused(f"model.checkpoint={ckpt}", "task=dataset")
    (tmp_path / "empty.jsonl").write_text("")
    assert "no rows" in refused(*base, f"task.path={tmp_path}/empty.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert "cannot be read as json" in refused(*base, f"task.path={tmp_path}/bad.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    assert "task.path" in refused(*base, f"task.path={tmp_path}/x.csv")
    assert "task.prompt_key='prompt' is not a column" in refused(*base, "task.prompt_key=prompt")
    assert "task.answer_key='sum'" in refused(*base, "task.answer_key=sum")
    assert "task.reward=nope.mod:f" in refused(*base, "task.reward=nope.mod:f")
    assert "has no function 'nope'" in refused(*base, "task.reward=user_rewards:nope")
    assert "task.reward='sometimes'" in refused(*base, "task.reward=sometimes")
    message = refused(*base, "task.reward=user_rewards:always_raises")
    assert "raised KeyError" in message and "first example" in message
    assert "task._target_" in refused(*base, "task._target_=user_rewards:Nope")
    assert "task.val_path" in refused(*base, "task.val_path=null", "rl.val_every=1")
    assert "task.tokenizer" in refused(*DATASET)  # no checkpoint, no tokenizer
    assert "no tokenizer.json" in refused(*base, f"task.tokenizer={tmp_path}")


def test_a_tokenizer_wider_than_the_model_is_refused(tmp_path):
    make_hf.write_tokenizer(tmp_path / "wide", make_hf.corpus_lines(str(TRAIN)), 320)
    message = refused(*DATASET, f"task.tokenizer={tmp_path / 'wide'}", "model.vocab_size=128")
    assert "has 320 tokens but the model only 128" in message or "only 128" in message


def test_the_entry_point_refuses_before_building_a_model(ckpt, tmp_path):
    args = [f"model.checkpoint={ckpt}", *DATASET, "task.reward=user_rewards:always_raises"]
    out = run_entry("zkl", [*args, *QUIET], tmp_path / "run")
    assert_refused_before_work(out, tmp_path / "run", "task.reward")


def test_a_reward_that_gives_nan_stops_the_run_after_the_step_is_logged(ckpt, tmp_path):
    args = [f"model.checkpoint={ckpt}", *DATASET, "task.reward=user_rewards:nan_when_long"]
    out = run_entry("zkl", [*args, "rl.steps=3", *QUIET], tmp_path / "run")
    lines = [
        line for line in out.stderr.splitlines() if line.strip() and "entry_runner" not in line
    ]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(lines) == 1 and "task.reward=user_rewards:nan_when_long returned nan" in lines[0]
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0] and rows[0]["train/gen_kl_error"] == 0.0
    assert not math.isnan(rows[0]["train/max_abs_logprob_diff"])


@pytest.mark.slow
def test_the_gpu_script_on_the_cpu(tmp_path):
    """scripts/gpu_dataset.sh at the tiny shape on the CPU: the H200 run's every part."""
    import os
    import subprocess

    env = {**os.environ, "SHAPE": "tiny", "DEVICE": "cpu", "STEPS": "2", "OUT": str(tmp_path)}
    env["EXTRA"] = "rl.prompts_per_step=2 rl.samples_per_prompt=4 rl.val_prompts=4"
    env["SHARD"] = "100KB"  # shards and an index, as the 1.5B writes them
    script = REPO / "scripts" / "gpu_dataset.sh"
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "-> PASS" in out.stdout
    assert (tmp_path / "ckpt_tiny" / "model.safetensors.index.json").is_file()
    rows = read_jsonl(tmp_path / "run_tiny" / "metrics.jsonl")
    assert len(rows) == 2 and all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all("val/accuracy" in r for r in rows)


@pytest.mark.slow
def test_the_user_sweep_runs_on_a_checkpoint_and_data(ckpt, tmp_path):
    """sweeps/recipes/user_matrix.yaml's own command, on the CPU and two of its points."""
    import os
    import shlex
    import subprocess
    import sys

    text = (REPO / "sweeps" / "recipes" / "user_matrix.yaml").read_text()
    line = next(x.lstrip("# ") for x in text.splitlines() if x.lstrip("# ").startswith("python"))
    cmd = shlex.split(line)
    cmd[0] = sys.executable
    cmd[cmd.index("--config-dir") + 1] = str(REPO / "sweeps" / "recipes")
    paths = {"model.checkpoint": ckpt, "task.path": TRAIN, "task.val_path": VAL}
    cmd = [
        f"{a.split('=')[0]}={paths[a.split('=')[0]]}" if a.split("=")[0] in paths else a
        for a in cmd
    ]
    cmd += ["hydra/launcher=basic", "device=cpu", f"hydra.sweep.dir={tmp_path}", *QUIET]
    cmd += ["task.prompt_key=question", "+precision=bf16,mxfp8", "kv=persist", "rl.steps=2"]
    cmd += ["zero_train_gen_mismatch=true", "rl.val_every=1", "rl.val_prompts=4"]
    cmd += ["rl.prompts_per_step=2", "rl.samples_per_prompt=4", "sampling.max_new_tokens=4"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == 2
    for job in jobs:
        rows = read_jsonl(job / "metrics.jsonl")
        assert [r["train/gen_kl_error"] for r in rows] == [0.0, 0.0]
        assert all("val/accuracy" in r for r in rows)
        assert "family: qwen2" in (job / "config.yaml").read_text()
    from zkl.report.runs import discover, summary

    runs = discover([tmp_path]).runs
    assert all(summary(r)["val_accuracy_final"] is not None for r in runs)


def test_add_accuracy_counts_the_number_a_response_starts_with():
    from zkl.data.tasks import AddTask, Problem

    task = AddTask(4)
    enc, eos = task.tokenizer.encode, task.tokenizer.eos_id
    problem = Problem(3, 4)
    assert task.is_correct(problem, [*enc("7"), eos]) and task.is_correct(problem, enc("7+"))
    assert not task.is_correct(problem, enc("77")) and not task.is_correct(problem, enc("a7"))
    assert not task.is_correct(problem, []) and not task.is_correct(problem, enc("8"))
