"""A checkpoint's tokenizer: `tokenizer.json` through the `tokenizers` library.

EOS and padding come from `tokenizer_config.json` (its `eos_token` / `pad_token`), else
from `generation_config.json` / `config.json` ids; padding falls back to EOS. The chat
template, when asked for, is rendered by transformers' `apply_chat_template` (the template
language is theirs), then encoded here like any text.
"""

from __future__ import annotations

import json
from pathlib import Path

from zkl.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"


def _read_json(path: Path, where: str) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: {path.name} is not JSON ({err}); fix or remove it.") from None
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    """tokenizer_config.json writes a special token as text or as {"content": text, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _first_id(value) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class HFTokenizer:
    """encode / decode, EOS and pad ids of a Hugging Face tokenizer directory."""

    def __init__(
        self, directory: str | Path, chat_template: bool = False, where: str | None = None
    ):
        """`where`: the setting that named `directory`, as the refusals say it
        (`zkl.data.config.tokenizer_source`); `task.tokenizer=DIRECTORY` unless given."""
        from tokenizers import Tokenizer

        self.directory = Path(directory)
        where = where or f"task.tokenizer={directory}"
        file = self.directory / TOKENIZER_FILE
        if not file.is_file():
            raise ConfigError(
                f"{where} has no {TOKENIZER_FILE}; name a directory a Hugging Face tokenizer "
                "was saved to (save_pretrained) with task.tokenizer."
            )
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as err:  # the Rust loader's own error types
            raise ConfigError(f"{where}: {TOKENIZER_FILE} cannot be read ({err}).") from None
        config = _read_json(self.directory / "tokenizer_config.json", where)
        ids = {**_read_json(self.directory / "config.json", where)}
        ids.update(_read_json(self.directory / "generation_config.json", where))
        self.eos_id = self._special(config.get("eos_token"), ids.get("eos_token_id"))
        if self.eos_id is None:
            raise ConfigError(
                f"{where} names no EOS token (tokenizer_config.json eos_token or an "
                "eos_token_id in config.json); a response could never end."
            )
        pad = self._special(config.get("pad_token"), ids.get("pad_token_id"))
        self.pad_id = self.eos_id if pad is None else pad
        self._chat = self._chat_tokenizer(where) if chat_template else None

    def _special(self, text, fallback) -> int | None:
        text = _token_text(text)
        if text is not None and self._tok.token_to_id(text) is not None:
            return self._tok.token_to_id(text)
        return _first_id(fallback)

    def _chat_tokenizer(self, where: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError(
                "task.chat_template=true renders the template with transformers, which is "
                "not installed; pip install transformers or set task.chat_template=false."
            ) from None
        tok = AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)
        if not tok.chat_template:
            raise ConfigError(
                f"task.chat_template=true but {where} has no chat template; set "
                "task.chat_template=false."
            )
        return tok

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def prompt_ids(self, text: str) -> list[int]:
        """A prompt's ids: as a user turn of the chat template, or the text itself."""
        if self._chat is None:
            return self.encode(text)
        rendered = self._chat.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return self.encode(rendered, special=False)  # the template wrote the specials

    def encode(self, text: str, special: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=special).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def response_text(self, ids: list[int]) -> str:
        """What a reward reads: the response up to EOS, special tokens left out."""
        ids = list(ids)
        if ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        return self.decode(ids, skip_special=True)
