"""Write a transformers checkpoint with random weights and a BPE tokenizer trained on text.

    python scripts/make_hf_checkpoint.py OUT_DIR --shape tiny \
        --family qwen2|qwen3|llama|mistral|gpt_oss --corpus tests/testdata/arith_train.jsonl \
        [--max-shard-size 200KB]

The model is written by transformers' own `save_pretrained` (config.json, safetensors,
an index when sharded), the tokenizer by `tokenizers`' BPE trainer and transformers'
`PreTrainedTokenizerFast.save_pretrained` (tokenizer.json, tokenizer_config.json and a
ChatML template), so zkl reads exactly what a user's checkpoint directory holds. Offline:
nothing is downloaded. Needs torch, transformers (>= 5) and tokenizers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The architecture numbers: tiny for CPU tests, and Qwen2.5-1.5B's config.json.
SHAPES = {
    "tiny": dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen2_5_1_5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


# --family -> transformers' config and model classes, and what the family adds to the shape:
# llama3 RoPE scaling that bends the tiny context's frequencies, a window shorter than a row;
# gpt-oss's sinks (transformers' init), a sliding and a full layer, YaRN and a top-2 MoE.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 8.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 32,
}
GPT_OSS = {
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "rope_parameters": YARN_ROPE,
    "tie_word_embeddings": False,
}
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", GPT_OSS),
}


def corpus_lines(path: str) -> list[str]:
    """Every string value of a JSONL file's rows (prompts and answers)."""
    lines = []
    with open(path) as f:
        for line in f:
            if line.strip():
                lines += [str(v) for v in json.loads(line).values()]
    return lines


def write_tokenizer(out: Path, texts: list[str], vocab_size: int) -> None:
    """A byte-level BPE (decode(encode(text)) == text) with Qwen's special tokens.

    Its alphabet is printable ASCII and newline, not all 256 bytes, so every token decodes
    to whole characters: any sequence a model samples decodes to valid text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    ascii_text = "\n" + "".join(map(chr, range(32, 127)))
    alphabet = sorted(
        {c for piece, _ in tok.pre_tokenizer.pre_tokenize_str(ascii_text) for c in piece}
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=alphabet,
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )
    fast.save_pretrained(str(out))


def write_model(
    out: Path, family: str, shape: str, seed: int, max_shard_size: str | None, device: str = "cpu"
) -> None:
    """Random weights (transformers' own init, seeded) saved in bf16; built on `device`."""
    import torch
    import transformers

    numbers = dict(SHAPES[shape])
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**numbers, **extra})
    cls = getattr(transformers, model_name)
    config.eos_token_id = SPECIALS.index("<|im_end|>")
    config.pad_token_id = SPECIALS.index("<|endoftext|>")
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(config).to(torch.bfloat16)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out), **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2")
    parser.add_argument("--corpus", required=True, help="a JSONL file the tokenizer learns")
    parser.add_argument("--tokenizer-vocab", type=int, default=320)
    parser.add_argument("--max-shard-size", default=None, help="e.g. 200KB: write shards")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the weights are initialised")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_model(out, args.family, args.shape, args.seed, args.max_shard_size, args.device)
    write_tokenizer(out, corpus_lines(args.corpus), args.tokenizer_vocab)
    print(out)


if __name__ == "__main__":
    main()
