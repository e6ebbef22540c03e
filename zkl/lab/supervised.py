"""A supervised warm start: a model that already answers part of the task, for GRPO to improve.

RL teams start GRPO from a model that is sometimes right (an SFT or instruct checkpoint). A
randomly initialised tiny model is not: on the `add` task, 150 GRPO steps from random
weights learn the answer's format and then the most common sum, and stop there (every group
agrees, so every advantage is 0; docs/treatments.md). A few supervised steps on the task's
own (prompt, right response) pairs give a model that is right on part of the validation set,
which GRPO then improves. The weights go to OUT as an HF checkpoint (`zkl.models.hf_export`),
read back with `model.checkpoint=OUT`. `python -m zkl.lab.warm_start OUT` runs it
(`zkl.lab.warm_start`, its command line).

The overrides are those of `python -m zkl` (the model, the task, `seed`, `device`,
`num_threads`); the problems are a draw apart from any GRPO run's. The loss is the token
mean of the right response's cross-entropy (EOS included), fp32, AdamW.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zkl import threads
from zkl.data.tasks import build_task
from zkl.device import resolve_device
from zkl.errors import ConfigError
from zkl.models.build import build_model
from zkl.models.hf_export import hf_config, save_checkpoint
from zkl.rl.evaluate import answered_right
from zkl.run.schema import ZklConfig
from zkl.run.validate import validate
from zkl.trainer.batch import pad_sequences

PROBLEM_SEED = 0x5F7  # added to `seed`: the warm start's problems are not a GRPO run's


def batch(task, problems) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt + right response tokens [B, T], and the mask [B, T-1] of the
    positions whose next token is a response token."""
    tokens, mask = pad_sequences(
        [task.prompt(p) for p in problems], [task.target(p) for p in problems]
    )
    return tokens, mask[:, :-1]  # the last position predicts nothing


def loss_of(model, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    device = model.embed_tokens.weight.device
    tokens, mask = tokens.to(device), mask.to(device)
    positions = torch.arange(tokens.shape[1], device=device).expand_as(tokens)
    logits = model(tokens, positions)[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return nll[mask].mean()


@torch.no_grad()
def greedy(model, prompt: list[int], max_new_tokens: int, eos_id: int) -> list[int]:
    device = model.embed_tokens.weight.device
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        t = torch.tensor([tokens], device=device)
        nxt = int(model(t, torch.arange(len(tokens), device=device)[None])[0, -1].argmax())
        tokens.append(nxt)
        if nxt == eos_id:
            break
    return tokens[len(prompt) :]


def accuracy(cfg, task, model) -> float:
    """The share of validation problems a greedy response gets right (as `val/accuracy`)."""
    problems = task.validation_problems(cfg.rl.val_prompts)
    eos = task.tokenizer.eos_id
    right = 0
    for p in problems:
        response = greedy(model, task.prompt(p), cfg.sampling.max_new_tokens, eos)
        right += answered_right(task, p, response, task.reward(p, response))
    return right / max(1, len(problems))


def warm_start(out: Path, cfg: ZklConfig, steps: int, lr: float, batch_size: int) -> float:
    """Train on `cfg` (composed and checked by the command line, `zkl.run.checks`), write the
    checkpoint to `out`, return the final validation accuracy."""
    validate(cfg)
    task = build_task(cfg)
    if not hasattr(task, "target"):
        raise ConfigError(
            f"task.name={cfg.task.name} has no right response to learn from; the warm start "
            "takes a task whose problems carry their answer (add, dataset)."
        )
    if steps < 1 or lr <= 0 or batch_size < 1:
        raise ConfigError("--steps, --lr and --batch must be positive.")
    try:
        hf_config(cfg.model)  # refused before any step when it cannot be written
    except ValueError as err:
        raise ConfigError(str(err)) from None
    threads.apply(cfg)
    model = build_model(cfg.model, torch.float32, seed=cfg.seed, device=resolve_device(cfg.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    score = accuracy(cfg, task, model)
    print(f"warm start of {cfg.model.name} on {cfg.task.name}: accuracy {score:.3f}")
    for step in range(steps):
        tokens, mask = batch(task, task.problems(cfg.seed + PROBLEM_SEED, step, batch_size))
        loss = loss_of(model, tokens, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % 10 == 0 or step + 1 == steps:
            score = accuracy(cfg, task, model)
            print(f"step {step + 1}: loss {loss.item():.4f}, accuracy {score:.3f}")
    save_checkpoint(model, out)
    print(f"wrote {out}: run GRPO from it with model.checkpoint={out}")
    return score
