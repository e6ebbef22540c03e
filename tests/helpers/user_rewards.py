"""A user's own rewards and task class, imported by name (`task.reward=user_rewards:...`)."""

from __future__ import annotations

from zkl.data.dataset import DatasetTask
from zkl.data.tasks import AddTask


def digit_share(prompt: str, response: str, answer: str) -> float:
    """The share of the response's characters that are digits (0 for an empty response)."""
    return sum(c.isdigit() for c in response) / len(response) if response else 0.0


def nan_when_long(prompt: str, response: str, answer: str) -> float:
    """NaN for any response longer than the answer: a bug a run meets only on real output."""
    return float("nan") if len(response) > len(answer) else 1.0


def always_raises(prompt: str, response: str, answer: str) -> float:
    raise KeyError("no such field")


class ParityTask(DatasetTask):
    """A user task class: the dataset task, rewarded by the parity of the response length.

    `task.params.parity` is its knob: 1.0 for responses of that many tokens modulo 2.
    """

    def __init__(self, cfg, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.parity = int(cfg.params.get("parity", 0))

    def reward(self, problem, response: list[int]) -> float:
        return 1.0 if len(response) % 2 == self.parity else 0.0


class ShapedMathTask(DatasetTask):
    """The dataset task with a reward a random-weight model finds signal in (the H200 run).

    1.0 for the right answer (the task's own reward, math-verify); else up to 0.5 for the
    share of response ids that are multiples of 3, which a near-uniform model earns about a
    third of, so rewards differ inside a group and every step updates the weights.
    val/accuracy still counts right answers only (reward 1.0).
    """

    def reward(self, problem, response: list[int]) -> float:
        if super().reward(problem, response) == 1.0:
            return 1.0
        return 0.5 * sum(t % 3 == 0 for t in response) / max(len(response), 1)


class NoCreditTask(AddTask):
    """The add task rewarding every response 0.0, as a reward whose answer format the model
    never writes (GSM8K's `#### N` from a small model): every group's rewards are equal, so
    every advantage is zero and no step trains."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__(cfg.max_operand)

    def reward(self, problem, response: list[int]) -> float:
        return 0.0
