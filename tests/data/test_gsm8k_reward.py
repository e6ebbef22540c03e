"""GSM8K-style data: the gold after `####`, the response's answer in the format asked for.

The strict rewards read only the marker the prompt asks for (`#### N`, `\\boxed{N}`), so
random-weight noise scores 0; the flexible one reads the last number (and so, like
math-verify, is fooled by noise that happens to end on the right digit).
"""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path

import pytest

from zkl.data import answers
from zkl.data.config import TaskConfig, check
from zkl.data.rewards import (
    call_reward,
    gsm8k_boxed,
    gsm8k_flexible,
    gsm8k_strict,
    load_reward,
    math_answer,
)
from zkl.errors import ConfigError

ROWS = [json.loads(x) for x in (Path(__file__).parents[1] / "testdata" / "gsm8k_rows.jsonl").open()]
GOLDS = ["72", "10", "2000", "3", "4", "2.5"]


def test_the_gold_is_the_number_after_the_last_hashes():
    assert [answers.gold(r["answer"]) for r in ROWS] == [Decimal(g) for g in GOLDS]
    assert answers.gold("72") == 72 and answers.gold(" $1,000.00 ") == 1000
    with pytest.raises(ValueError, match="no '#### N' line"):
        answers.gold("She has 3 left.")
    with pytest.raises(ValueError, match="no '#### N' line"):
        answers.gold("3 + 4 = 7\n#### seven")


def test_a_row_s_own_solution_scores_one_in_every_mode():
    for row in ROWS:
        assert gsm8k_strict("q", row["answer"], row["answer"]) == 1.0
        assert gsm8k_flexible("q", row["answer"], row["answer"]) == 1.0


STRICT = [  # (response, gold, strict `####`, strict boxed, flexible)
    ("The total is 48+24 = 72 muffins.\n#### 72", "72", 1, 0, 1),
    ("#### 72.0", "72", 1, 0, 1),
    ("#### $72.", "72", 1, 0, 1),
    ("#### 2,000", "2000", 1, 0, 1),
    ("#### 2.50", "2.5", 1, 0, 1),
    ("#### -2", "-2", 1, 0, 1),
    ("So she needs \\boxed{2.5} minutes.", "2.5", 0, 1, 1),
    ("\\boxed{\\$1,250}", "1250", 0, 1, 1),
    ("\\boxed{72} and then \\boxed{71}", "72", 0, 0, 0),  # the last box counts
    ("#### 72\nwait, no\n#### 71", "72", 0, 0, 0),  # the last marker counts
    ("#### 72 muffins", "72", 0, 0, 1),  # strict: the marker's line is the number only
    ("#### 7 2", "72", 0, 0, 0),
    ("The answer is 72", "72", 0, 0, 1),
    ("72 is what I get, not 71", "72", 0, 0, 0),
    ("", "72", 0, 0, 0),
]


@pytest.mark.parametrize("response,gold,strict,boxed,flexible", STRICT)
def test_each_mode_reads_its_own_format(response, gold, strict, boxed, flexible):
    answer = f"worked solution\n#### {gold}"
    assert gsm8k_strict("q", response, answer) == strict
    assert gsm8k_boxed("q", response, answer) == boxed
    assert gsm8k_flexible("q", response, answer) == flexible


# What a random-weight model wrote on GSM8K-format data, and what the math reward gave 1.0.
NOISE = [
    ("k tot 2How<|endoftext|>", "#### 2"),
    ("k tot 2How", "#### 2"),
    (" the 72 bl ####", "#### 72"),
    ("####72How many", "#### 72"),
    ("\\boxed{ 3x}", "#### 3"),
]


@pytest.mark.parametrize("response,answer", NOISE)
def test_noise_scores_zero_in_strict_mode(response, answer):
    assert gsm8k_strict("q", response, answer) == 0.0
    assert gsm8k_boxed("q", response, answer) == 0.0


def test_math_verify_and_flexible_take_any_last_number():
    """The leniency docs/recipes.md states: the last number anywhere counts."""
    load_reward("math")
    assert math_answer("q", "k tot 2How<|endoftext|>", "#### 2") == 1.0
    assert gsm8k_flexible("q", "k tot 2How<|endoftext|>", "#### 2") == 1.0


def test_random_noise_never_scores_in_strict_mode():
    """Seeded noise over a GSM8K-ish alphabet, the answer's digits and markers included."""
    rng = random.Random(0)
    pieces = [*"0123456789 .,$#{}\n", "####", "\\boxed{", "the", "How", "<|endoftext|>"]
    for row, gold in zip(ROWS, GOLDS):
        for _ in range(300):
            noise = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 24)))
            if gsm8k_strict("q", noise, row["answer"]):  # only a true `#### gold` line scores
                assert answers.after_hashes(noise) == Decimal(gold), noise
            if gsm8k_boxed("q", noise, row["answer"]):
                assert answers.boxed(noise) == Decimal(gold), noise


def test_the_names_and_a_gold_without_a_number():
    for name, fn in (("gsm8k", gsm8k_strict), ("gsm8k_boxed", gsm8k_boxed)):
        assert load_reward(name) is fn
    assert load_reward("gsm8k_flexible") is gsm8k_flexible
    with pytest.raises(Exception, match="task.reward=gsm8k raised ValueError: the answer"):
        call_reward(gsm8k_strict, "gsm8k", "q", "#### 3", "three")
    with pytest.raises(ConfigError, match="gsm8k_boxed"):
        load_reward("gsm8k_box")


def test_the_prompt_template_must_hold_the_prompt_once():
    check(TaskConfig(prompt_template="{prompt}\nEnd with a line '#### N'."))
    for bad in ("no placeholder", "{prompt} {prompt}"):
        with pytest.raises(ConfigError, match="task.prompt_template="):
            check(TaskConfig(prompt_template=bad))


def test_a_gsm8k_dataset_task_templates_prompts_and_scores_responses(tmp_path):
    """The rows through DatasetTask: the template asks for the format, the reward reads it."""
    import importlib.util

    from zkl.data.dataset import DatasetTask

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_hf_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_hf", script)
    make_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_hf)
    data = Path(__file__).parents[1] / "testdata" / "gsm8k_rows.jsonl"
    make_hf.write_tokenizer(tmp_path, make_hf.corpus_lines(str(data)), 300)
    template = "{prompt}\nEnd your answer with a line '#### N'."
    cfg = TaskConfig(name="dataset", path=str(data), prompt_key="question", reward="gsm8k")
    cfg.tokenizer, cfg.prompt_template = str(tmp_path), template
    task = DatasetTask(cfg, vocab_size=1024)
    first = task.train[0]
    assert first.prompt_text == template.replace("{prompt}", ROWS[0]["question"])
    assert task.tokenizer.decode(task.prompt(first)) == first.prompt_text
    encode = task.tokenizer.encode
    assert task.reward(first, encode("48+24 = 72\n#### 72") + [task.tokenizer.eos_id]) == 1.0
    assert task.reward(first, encode("k tot 72How")) == 0.0
