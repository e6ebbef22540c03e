"""Final numeric answers read out of a text: GSM8K's `#### N` line, `\\boxed{N}`, the last number.

GSM8K's `answer` column is a worked solution whose last line is `#### 72`; a response is
asked (by the prompt the dataset or the chat template gives) to end the same way, or with
`\\boxed{72}`. A number is compared as an exact decimal value after normalising how people
write it: thousands commas (`1,000`), a currency sign (`$18`, `\\$18`), a trailing full
stop (`72.`) and trailing zeros (`72.0` is `72`). Nothing else is guessed: a marker
followed by anything but a number reads as no answer.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

# One number as written: sign, currency, digits with optional thousands commas, decimals.
_NUMBER = r"-?(?:\\?\$\s*)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?(?:\\?\$\s*)?\.\d+"
_WHOLE_NUMBER = re.compile(rf"^\s*({_NUMBER})\s*\.?\s*$")
_ANY_NUMBER = re.compile(_NUMBER)
_BOXED = re.compile(r"\\boxed\s*\{")


def number(text: str) -> Decimal | None:
    """The value of `text` when it is exactly one number (normalised), else None."""
    match = _WHOLE_NUMBER.match(text)
    if not match:
        return None
    digits = re.sub(r"[\s,$\\]", "", match.group(1))
    try:
        return Decimal(digits).normalize() + 0  # + 0 turns -0 into 0
    except InvalidOperation:
        return None


def after_hashes(text: str) -> Decimal | None:
    """The number on the rest of the line after the text's last `####`, else None."""
    head, marker, tail = text.rpartition("####")
    if not marker:
        return None
    return number(tail.split("\n", 1)[0])


def boxed(text: str) -> Decimal | None:
    """The number inside the text's last `\\boxed{...}` (braces balanced), else None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return number(text[start:i])
    return None  # never closed


def last_number(text: str) -> Decimal | None:
    """The last number anywhere in the text (the flexible reading), else None."""
    found = _ANY_NUMBER.findall(text)
    return number(found[-1]) if found else None


@lru_cache(maxsize=65536)
def gold(answer: str) -> Decimal:
    """The reference value: after the answer's last `####`, or the answer if it is a number."""
    value = after_hashes(answer) if "####" in answer else number(answer)
    if value is None:
        raise ValueError(
            f"the answer {answer[-60:]!r} ends with no '#### N' line and is not a number"
        )
    return value
