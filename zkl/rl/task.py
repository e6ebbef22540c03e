"""The built-in verifiable task: add two digits; a character tokenizer ships with it.

Every prompt starts with the same system text (two full 16-token blocks), so the prefix
cache has real hits; a question phrase of varied length follows, so prompts differ in length
and prefill batches are ragged, while the operands always sit just before the final `=`.
The reward gives partial credit for the format, so a tiny random model finds signal in its
first steps: 1.0 for exactly the sum then EOS, 0.5 for a response that starts with the right
digit, 0.2 for one that starts with any digit, else 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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

    def reward(self, problem: Problem, response: list[int]) -> float:
        tok = self.tokenizer
        answer = tok.encode(problem.answer)
        if response == [*answer, tok.eos_id]:
            return 1.0
        if response[: len(answer)] == answer:
            return 0.5
        if response and response[0] in tok.digit_ids:
            return 0.2
        return 0.0


def build_task(name: str, max_operand: int) -> AddTask:
    if name != "add":
        raise ValueError(f"task.name={name!r} is not a built-in task; use add.")
    return AddTask(max_operand)
