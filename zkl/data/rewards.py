"""Rewards of a dataset task: `exact`, `math` (math-verify), `gsm8k` (and its boxed and
flexible readings) or a user function.

Every reward is a function `(prompt, response, answer) -> float` of texts: the prompt as
the dataset gave it, the decoded response (up to EOS, no special tokens) and the answer.
`task.reward=package.module:function` names your own with that signature.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable
from functools import lru_cache

from zkl.data import answers
from zkl.errors import ConfigError, RunFault

RewardFn = Callable[[str, str, str], float]


class RewardError(RunFault):
    """A reward function raised or gave no finite number; the step is logged, the run stops."""


def exact_match(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response is the answer (surrounding whitespace ignored), else 0.0."""
    return float(response.strip() == answer.strip())


@lru_cache(maxsize=65536)
def _gold(answer: str):
    from math_verify import parse

    return parse(answer)


def math_answer(prompt: str, response: str, answer: str) -> float:
    """1.0 when math-verify finds the answer's value in the response, else 0.0.

    math-verify extracts a `\\boxed{}` answer first, else the LaTeX or plain expression it
    finds (so "... the answer is 12" and "$\\frac{1}{2}$" both count), and compares values,
    not strings (0.5 matches 1/2).
    """
    from math_verify import parse, verify

    gold = _gold(answer)
    if not gold:  # the answer itself has no value math-verify reads: compare the text
        return exact_match(prompt, response, answer)
    return float(verify(gold, parse(response)))


def gsm8k_strict(prompt: str, response: str, answer: str) -> float:
    """1.0 when the number on the response's last `#### N` line is the gold one, else 0.0.

    The gold is the number after the answer's last `####` (GSM8K's worked solutions), or
    the answer itself when it is a number (zkl/data/answers.py says what is normalised).
    """
    gold = answers.gold(answer)
    return float(answers.after_hashes(response) == gold)


def gsm8k_boxed(prompt: str, response: str, answer: str) -> float:
    """1.0 when the number in the response's last `\\boxed{N}` is the gold one, else 0.0."""
    gold = answers.gold(answer)
    return float(answers.boxed(response) == gold)


def gsm8k_flexible(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response's last number, wherever it stands, is the gold one (lenient)."""
    gold = answers.gold(answer)
    return float(answers.last_number(response) == gold)


BUILT_IN: dict[str, RewardFn] = {
    "exact": exact_match,
    "math": math_answer,
    "gsm8k": gsm8k_strict,
    "gsm8k_boxed": gsm8k_boxed,
    "gsm8k_flexible": gsm8k_flexible,
}


def load_reward(spec: str) -> RewardFn:
    """The reward `task.reward` names; an unknown or unimportable one is one sentence."""
    if spec in BUILT_IN:
        if spec == "math":
            try:
                import math_verify  # noqa: F401
            except ImportError:
                raise ConfigError(
                    "task.reward=math needs math-verify (pip install math-verify), or set "
                    "task.reward=exact."
                ) from None
            logging.getLogger("math_verify").setLevel(logging.ERROR)
        return BUILT_IN[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"task.reward={spec!r} is not one of {', '.join(BUILT_IN)} nor package.module:function."
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure of the user's module
        raise ConfigError(
            f"task.reward={spec}: module {module_name!r} cannot be imported "
            f"({type(err).__name__}: {err}); check the name and PYTHONPATH."
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"task.reward={spec}: {module_name} has no function {attr!r}.")
    return fn


def call_reward(fn: RewardFn, spec: str, prompt: str, response: str, answer: str) -> float:
    """`fn`'s reward as a finite float, or RewardError naming `task.reward` and the fault."""
    try:
        value = fn(prompt, response, answer)
    except Exception as err:
        raise RewardError(
            f"task.reward={spec} raised {type(err).__name__}: {err} on the response "
            f"{response[:60]!r}"
        ) from None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise RewardError(
            f"task.reward={spec} returned {value!r}, not a number, on the response "
            f"{response[:60]!r}"
        ) from None
    if not math.isfinite(value):
        raise RewardError(f"task.reward={spec} returned {value} on the response {response[:60]!r}")
    return value
