"""Advice for names and values that are almost right: close names, look-alike letters, dotted paths, ``1e6``.

Pure functions returning the text to append to a message (empty when there is
nothing to add):

- :func:`closest`: the valid names closest to an unknown one; when the unknown
  name holds non-ASCII characters (a Cyrillic ``е`` in ``lеarning_rate`` prints
  exactly like the suggestion ``learning_rate``) each is named with its code point,
  so the difference can be seen;
- :func:`dotted_hint`: ``--a.b value`` or ``a.b:`` sets no nested value; the
  message says how a nested value is written;
- :func:`number_text_hint`: YAML 1.1, which PyYAML reads, takes ``1e6`` and
  ``1E-6`` for text (a float needs a dot and, with an exponent, a signed one:
  ``1.0e+6``); the message says so and gives the number in a spelling YAML reads.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

#: Numbers in exponent notation that YAML 1.1 reads as text (no dot, or an unsigned exponent).
_EXPONENT_TEXT = re.compile(r"[-+]?(?:\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+")


def unicode_note(name: str) -> str:
    """`` ('lеarning_rate' holds the non-ASCII 'е' (U+0435 CYRILLIC SMALL LETTER IE) at position 2)``."""
    odd = [(i, ch) for i, ch in enumerate(name) if not ch.isascii()]
    if not odd:
        return ""
    shown = ", ".join(f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}) at position {i}" for i, ch in odd)
    return f" ({name!r} holds the non-ASCII {shown}: retype it in plain ASCII)"


def closest(name: str, options: Sequence[str]) -> str:
    """``; did you mean 'a', 'b'?`` for the options closest to ``name`` (with :func:`unicode_note`)."""
    folded = unicodedata.normalize("NFKD", name)
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    if folded != name:
        close = list(dict.fromkeys(difflib.get_close_matches(folded, list(options), n=3, cutoff=0.6) + close))[:3]
    suggestion = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return suggestion + unicode_note(name)


def dotted_hint(name: str, fields: Sequence[str], *, cli: bool) -> str:
    """How to write the nested value ``name`` (``environments.0.name``) spells as a dotted path; "" if no dot."""
    if "." not in name:
        return ""
    head, _, rest = name.partition(".")
    example = f"'{{{rest.split('.')[0]}: ...}}'" if not rest.split(".")[0].isdigit() else "'[{...}]'"
    unknown = "" if head in fields else f" ({head!r} is no field either{closest(head, fields)})"
    if cli:
        fix = f"give the whole value as YAML: --{head} {example}"
        whole = " (it replaces the file's value whole)" if head in fields else ""
        return f"; a dotted name sets no nested value: {fix}{whole}{unknown}"
    return f"; a dotted key sets no nested value: write {head}: with the nested value under it{unknown}"


def number_text_hint(name: str, value: Any, *, cli: bool) -> str | None:
    """Advice when ``value`` of ``name`` is text YAML 1.1 did not read as a number (``1e6``); None otherwise."""
    if not isinstance(value, str) or not _EXPONENT_TEXT.fullmatch(value.strip()):
        return None
    number = float(value.replace("_", ""))
    plain = str(int(number)) if number.is_integer() and abs(number) < 1e16 else repr(number)
    mantissa, _, exponent = value.strip().lower().partition("e")
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    spelled = f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"
    written = f"--{name} {plain}" if cli else f"{name}: {plain}"
    return (
        f"YAML reads {value} as text, not a number (in YAML 1.1 a number in exponent notation needs "
        f"a dot and a signed exponent: {spelled}); write {written}"
    )
