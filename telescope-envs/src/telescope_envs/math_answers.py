"""Final-answer extraction and equivalence for math environments.

- :func:`extract_boxed` returns the content of the last ``\\boxed{...}`` (or
  ``\\fbox{...}``) in a text, with nested braces handled, and ``\\boxed 5`` too.
- :func:`answers_match` decides whether a predicted answer equals a reference:
  first a cheap normalised string comparison, then ``math-verify`` (symbolic and
  numeric equivalence: ``\\frac12`` = ``0.5`` = ``\\dfrac{1}{2}``, ``x^2+1`` =
  ``1+x^2``, sets and intervals). ``math-verify`` is an optional dependency
  (``pip install 'telescope-envs[math]'``), imported on first use.

``math-verify`` guards its sympy work with ``signal.alarm`` timeouts, which only
work in the main thread; reward functions run in worker threads, so there the
timeouts are disabled (pathological inputs are bounded by the length cap here), and
the warning math-verify logs about it for every call is filtered out.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from telescope_envs._deps import require

_MAX_ANSWER_CHARS = 400
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (None when there is none)."""
    found: str | None = None
    for match in _BOX_RE.finditer(text):
        i = match.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        found = text[i + 1 : j]
                        break
                j += 1
        elif i < len(text):  # \boxed 5
            m = re.match(r"[^\s$]+", text[i:])
            if m:
                found = m.group(0)
    return found.strip() if found is not None else None


def normalize(answer: str) -> str:
    """A light LaTeX normalisation for the fast path (spaces, \\left/\\right, dfrac, $, text)."""
    s = answer.strip().strip("$").strip()
    s = re.sub(r"\\(?:left|right)\s*", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s


def answers_match(predicted: str, reference: str, environment: str = "hendrycks_math") -> bool:
    """Whether ``predicted`` equals ``reference`` up to formatting and mathematical equivalence."""
    return check_answer(predicted, reference, environment)[0]


def check_answer(predicted: str, reference: str, environment: str = "hendrycks_math") -> tuple[bool, str]:
    """:func:`answers_match`, and what decided: ``"string"`` (normalised text), ``"math_verify"`` or ``"none"``."""
    if not predicted or len(predicted) > _MAX_ANSWER_CHARS:
        return False, "none"
    if normalize(predicted) == normalize(reference):
        return True, "string"
    return _math_verify_match(predicted, reference, environment), "math_verify"


def _drop_timeout_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Timeout is disabled")


def _math_verify_match(predicted: str, reference: str, environment: str) -> bool:
    mv: Any = require("math_verify", "math", environment)
    for name in ("math_verify.grader", "math_verify.parser"):  # idempotent: a filter is added once
        log = logging.getLogger(name)
        if _drop_timeout_warning not in log.filters:
            log.addFilter(_drop_timeout_warning)
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    try:
        gold = mv.parse(f"${reference}$", parsing_timeout=timeout)
        pred = mv.parse(f"${predicted}$", parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(mv.verify(gold, pred, timeout_seconds=timeout))
    except Exception:
        return False
