"""The built-in verifiable tasks.

`add` (the CPU default): add two digits; a character tokenizer ships with it. Every prompt
starts with the same system text (two full 16-token blocks), so the prefix cache has real
hits; a question phrase of varied length follows, so prompts differ in length and prefill
batches are ragged, while the operands always sit just before the final `=`. The reward
gives partial credit for the format, so a tiny random model finds signal in its first steps:
1.0 for exactly the sum then EOS, 0.5 for a response that starts with the right digit, 0.2
for one that starts with any digit, else 0.

`residue` (the GPU shapes): tokens over the model's whole vocabulary (ResidueTask).

`dataset`: your prompts and answers, an HF tokenizer and a reward (zkl/data/dataset.py).
`task._target_=package.module:Class` (or `package.module.Class`): a task class of your own,
built as `Class(task_cfg, vocab_size)`. A task gives `tokenizer` (`eos_id`, `len()`),
`max_prompt_len`, `problems(seed, step, count)`, `prompt(problem)`, `reward(problem,
response_ids)`, and for `rl.val_every` also `validation_problems(limit)`.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass

from zkl.data.config import TASKS
from zkl.data.dataset import DatasetTask
from zkl.errors import ConfigError

PAD, EOS = "<pad>", "<eos>"
CHARS = "0123456789+=?:. \nabcdefghijklmnopqrstuvwxyz"
SYSTEM = "sum the two digits. reply digits.\n"
PHRASES = ("", "q: ", "add ")  # between SYSTEM and "a+b="; 42 tokens at most


class CharTokenizer:
    def __init__(self) -> None:
        self.vocab = [PAD, EOS, *CHARS]
        self.index = {s: i for i, s in enumerate(self.vocab)}
        self.pad_id, self.eos_id = self.index[PAD], self.index[EOS]
        self.digit_ids = frozenset(self.index[d] for d in "0123456789")

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        unknown = set(text) - set(CHARS)
        if unknown:
            raise ValueError(f"characters {sorted(unknown)} are not in the task tokenizer")
        return [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        """Text of ids; specials and ids past the vocabulary (a model may be wider) drop out."""
        return "".join(self.vocab[i] if 2 <= i < len(self.vocab) else "" for i in ids)


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    phrase: str = ""

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


class AddTask:
    def __init__(self, max_operand: int = 4):
        self.max_operand = max_operand
        self.tokenizer = CharTokenizer()

    def prompt(self, problem: Problem) -> list[int]:
        return self.tokenizer.encode(f"{SYSTEM}{problem.phrase}{problem.a}+{problem.b}=")

    @property
    def max_prompt_len(self) -> int:
        return max(len(self.prompt(Problem(0, 0, phrase))) for phrase in PHRASES)

    def problems(self, seed: int, step: int, count: int) -> list[Problem]:
        rng = random.Random(seed * 1_000_003 + step)
        top = self.max_operand
        return [
            Problem(rng.randint(0, top), rng.randint(0, top), rng.choice(PHRASES))
            for _ in range(count)
        ]

    def varied_prompts(self, seed: int, count: int) -> list[list[int]]:
        """Prompts of varied length behind the shared system prefix (certification)."""
        rng = random.Random(seed)
        alphabet = self.tokenizer.encode("0123456789+=abcdefghij ")
        prefix = self.tokenizer.encode(SYSTEM)
        return [
            prefix + [rng.choice(alphabet) for _ in range(rng.randint(1, 24))] for _ in range(count)
        ]

    def validation_problems(self, limit: int = 0) -> list[Problem]:
        """Every operand pair once, behind the first phrase: a fixed validation set."""
        top = self.max_operand
        out = [Problem(a, b) for a in range(top + 1) for b in range(top + 1)]
        return out[:limit] if limit else out

    def is_correct(self, problem: Problem, response: list[int]) -> bool:
        """The number the response starts with is the sum (what `val/accuracy` counts)."""
        digits = self.tokenizer.digit_ids
        lead = len(response)
        for i, t in enumerate(response):
            if t not in digits:
                lead = i
                break
        return response[:lead] == self.tokenizer.encode(problem.answer)

    def target(self, problem: Problem) -> list[int]:
        """A right response: the sum, then EOS (what a supervised warm start learns)."""
        return [*self.tokenizer.encode(problem.answer), self.tokenizer.eos_id]

    def reward(self, problem: Problem, response: list[int]) -> float:
        if response == self.target(problem):
            return 1.0
        answer = self.tokenizer.encode(problem.answer)
        if response[: len(answer)] == answer:
            return 0.5
        if response and response[0] in self.tokenizer.digit_ids:
            return 0.2
        return 0.0


class IdTokenizer:
    """Token ids are the vocabulary itself: 0 is padding, 1 is EOS, the rest are content."""

    pad_id, eos_id = 0, 1

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size


@dataclass(frozen=True)
class ResidueProblem:
    prompt: tuple[int, ...]

    @property
    def residue_of(self) -> int:
        return self.prompt[-1]


class ResidueTask:
    """A task over a model's whole (large) vocabulary that a random-weight model can score on.

    A prompt is a shared 32-token prefix (two prefix-cache blocks) and a tail of random
    content tokens of random length; the reward is the fraction of response tokens whose id
    is congruent to the prompt's last token modulo `modulus` (EOS counts as a miss). A
    near-uniform random model earns about 1/modulus a token, so rewards vary inside a group,
    advantages are non-zero and every step changes the weights; a policy that learns to
    favour the right residue class earns more.
    """

    PREFIX_LEN = 32

    def __init__(self, vocab_size: int, modulus: int, min_len: int, max_len: int):
        self.tokenizer = IdTokenizer(vocab_size)
        self.modulus, self.min_len, self.max_len = modulus, min_len, max_len
        prefix_rng = random.Random(0x5EED)
        self.prefix = [prefix_rng.randrange(2, vocab_size) for _ in range(self.PREFIX_LEN)]

    def prompt(self, problem: ResidueProblem) -> list[int]:
        return list(problem.prompt)

    @property
    def max_prompt_len(self) -> int:
        return self.PREFIX_LEN + self.max_len

    def problems(self, seed: int, step: int, count: int) -> list[ResidueProblem]:
        rng = random.Random(seed * 1_000_003 + step)
        vocab = self.tokenizer.vocab_size
        out = []
        for _ in range(count):
            tail = [rng.randrange(2, vocab) for _ in range(rng.randint(self.min_len, self.max_len))]
            out.append(ResidueProblem(tuple(self.prefix + tail)))
        return out

    def varied_prompts(self, seed: int, count: int) -> list[list[int]]:
        """Prompts of varied length behind the shared prefix (certification)."""
        rng = random.Random(seed)
        vocab = self.tokenizer.vocab_size
        return [
            self.prefix + [rng.randrange(2, vocab) for _ in range(rng.randint(1, 24))]
            for _ in range(count)
        ]

    def validation_problems(self, limit: int = 0) -> list[ResidueProblem]:
        """A fixed draw of 32 problems (seed apart from every training step's)."""
        return self.problems(seed=-1, step=0, count=limit or 32)

    def reward(self, problem: ResidueProblem, response: list[int]) -> float:
        if not response:
            return 0.0
        target = problem.residue_of % self.modulus
        eos = self.tokenizer.eos_id
        hits = sum(1 for t in response if t != eos and t % self.modulus == target)
        return hits / len(response)


def task_class(target: str) -> type:
    """The class `task._target_` names (`pkg.mod:Class` or `pkg.mod.Class`), or one sentence."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr, None) if module_name else None
    except Exception as err:  # any import-time failure of the user's module
        raise ConfigError(
            f"task._target_={target}: module {module_name!r} cannot be imported "
            f"({type(err).__name__}: {err}); check the name and PYTHONPATH."
        ) from None
    if not isinstance(cls, type):
        raise ConfigError(f"task._target_={target} names no class; use package.module:Class.")
    return cls


def build_task(cfg):
    """The task of the run config `cfg`: the one `task.name` (or `task._target_`) names;
    `residue` spans the model's vocabulary, `dataset` defaults its tokenizer to
    `model.checkpoint`."""
    task_cfg, vocab_size = cfg.task, cfg.model.vocab_size
    if task_cfg._target_:
        return task_class(task_cfg._target_)(task_cfg, vocab_size)
    if task_cfg.name == "dataset":
        return DatasetTask(task_cfg, vocab_size, cfg.model.checkpoint)
    if task_cfg.name == "add":
        return AddTask(task_cfg.max_operand)
    if task_cfg.name == "residue":
        return ResidueTask(
            vocab_size, task_cfg.modulus, task_cfg.min_prompt_len, task_cfg.max_prompt_len
        )
    raise ConfigError(f"task.name={task_cfg.name!r} is not a built-in task; use one of {TASKS}.")
