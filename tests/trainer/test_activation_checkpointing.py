"""`trainer.activation_checkpointing`: each layer's activations remade in the backward. The
gradients and a run's records are bitwise those without it; the estimate keeps one layer's
activations instead of every layer's; what it cannot remake refuses before any work."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl import invariance
from zkl.distributed.checks import check_trainer
from zkl.errors import ConfigError
from zkl.memory import estimate
from zkl.models.build import build_model
from zkl.rl.loop import run
from zkl.trainer.scoring import sequence_logprobs

FAMILIES = ["tiny_dense", "tiny_moe", "tiny_hybrid", "tiny_gpt_oss"]
MODES = {"zero": invariance.FIXES, "default": ()}


def _grads(model, tokens, checkpointed: bool) -> tuple[list[torch.Tensor], int]:
    """Every parameter's gradient of the summed logprobs, and how many layer forwards ran."""
    model.checkpoint_layers = checkpointed
    calls = []
    hooks = [layer.register_forward_pre_hook(lambda *_: calls.append(1)) for layer in model.layers]
    model.zero_grad(set_to_none=True)
    sequence_logprobs(model, tokens).sum().backward()
    for hook in hooks:
        hook.remove()
    return [p.grad.clone() for p in model.parameters()], len(calls)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", FAMILIES)
def test_gradients_are_bitwise_those_without_checkpointing(name, mode):
    cfg = make_cfg(f"model={name}").model
    model = build_model(cfg, torch.bfloat16, seed=1)
    tokens = torch.randint(2, cfg.vocab_size, (3, 19), generator=torch.Generator().manual_seed(0))
    with invariance.enabled(MODES[mode]):
        plain, plain_calls = _grads(model, tokens, checkpointed=False)
        remade, remade_calls = _grads(model, tokens, checkpointed=True)
    layers = cfg.num_hidden_layers
    assert plain_calls == layers and remade_calls == 2 * layers  # the backward remade each layer
    assert all(torch.equal(a, b) for a, b in zip(plain, remade))


def test_a_run_is_bitwise_the_same_with_checkpointing(tmp_path):
    """Two GRPO steps, tokens and metrics (timing aside), with and without it."""
    rows = {}
    for on in (False, True):
        cfg = make_cfg(*SMALL, "rl.steps=2", "tracking.dump_tokens=all",
                       f"trainer.activation_checkpointing={on}")  # fmt: skip
        rows[on] = run(cfg, tmp_path / str(on))
    timed = ("timing/", "perf/")
    for plain, remade in zip(rows[False], rows[True]):
        assert {k: v for k, v in plain.items() if not k.startswith(timed)} == {
            k: v for k, v in remade.items() if not k.startswith(timed)
        }
        assert plain["optim/update_norm"] > 0
    tokens = [(tmp_path / str(on) / "tokens.jsonl").read_text() for on in (False, True)]
    assert tokens[0] and tokens[0] == tokens[1]


def test_the_estimate_keeps_one_layer_of_activations():
    long = ["model=qwen2_5_1_5b", "task.name=residue", "sampling.max_new_tokens=8192"]
    plain = estimate(make_cfg(*long), 16384)["update activations"]
    remade = estimate(make_cfg(*long, "trainer.activation_checkpointing=true"), 16384)
    assert remade["update activations"] < plain / 4


def test_the_estimate_prefills_prompts_a_chunk_at_a_time():
    """The scheduler's prefill forward holds each row's prompt (at most `scheduler.prefill_chunk`
    tokens of it), not the response's positions too."""
    base = ["model=qwen2_5_1_5b", "task.name=residue", "scheduler.max_batch_size=64"]
    prompt, response = 4096, 4096

    def gen(*extra):
        cfg = make_cfg(*base, f"sampling.max_new_tokens={response}", *extra)
        return estimate(cfg, prompt + response)["generation activations"]

    whole, chunked = gen(), gen("scheduler.prefill_chunk=1024")
    assert whole == pytest.approx(4 * (chunked - 64 * 151936 * 12) + 64 * 151936 * 12)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["engine=megatron_local"], "engine.name"),
        (["model=tiny_moe", "rl.routing_replay=true"], "rl.routing_replay"),
        (["model=tiny_moe", "rl.record_routes=true"], "rl.record_routes"),
    ],
)
def test_what_it_cannot_remake_refuses(overrides, key):
    """The trainer group's check (megatron-core itself may be missing here: `validate` would
    say that first)."""
    cfg = make_cfg(*overrides, "trainer.activation_checkpointing=true")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        check_trainer(cfg)
    assert "trainer.activation_checkpointing" in str(err.value)


@pytest.mark.gpu
def test_gradients_are_bitwise_the_same_on_cuda():
    """Zero mode at the 1.5B's widths, cut to 2 layers, 2 x 2048 tokens (the backward of zero
    mode's attention is deterministic; the default path's need not be)."""
    cfg = make_cfg("model=qwen2_5_1_5b", "model.num_hidden_layers=2", "device=cuda").model
    model = build_model(cfg, torch.bfloat16, seed=1, device="cuda")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, cfg.vocab_size, (2, 2048), generator=g).cuda()
    with invariance.enabled(invariance.FIXES):
        plain, _ = _grads(model, tokens, checkpointed=False)
        remade, calls = _grads(model, tokens, checkpointed=True)
    assert calls == 2 * cfg.num_hidden_layers
    assert all(torch.equal(a, b) for a, b in zip(plain, remade))
