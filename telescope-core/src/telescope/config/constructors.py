"""What an environment's constructor accepts: its keyword parameters and their annotated types.

:func:`constructor_of` reads a class's signature once (cached per class: a config
may list thousands of entries of the same environment, and ``inspect.signature``
costs about 0.3 ms a call). :func:`kwargs_type_problems` checks the values of an
entry's ``kwargs`` against the annotations of the parameters they name, so that
``num_numbers: "3"`` is a validate-time error naming the environment, the argument
and the type, not a ``TypeError`` deep inside a worker.

Design. Annotations are resolved with :func:`typing.get_type_hints` (modules with
``from __future__ import annotations`` hold them as strings) and checked with a
pydantic ``TypeAdapter`` in strict mode: the constructor receives the values as YAML
wrote them, unconverted, so ``"3"`` for an ``int`` is wrong even though pydantic's
lax mode would convert it. Two conversions that constructors take in their stride
are allowed: a list for a tuple or set annotation (YAML has no tuples) and text for
a ``Path``. An ``int`` is accepted for ``float`` (as in Python). Limits: a
constructor whose annotations cannot be resolved (a name imported only under
``TYPE_CHECKING``) or a parameter annotated with a type pydantic cannot check is not
type-checked; unannotated and ``Any`` parameters accept anything.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from telescope.config.spelling import number_text_hint


@dataclass(frozen=True)
class Constructor:
    """The keyword parameters of a class's constructor (none known when its signature cannot be read)."""

    keyword: dict[str, inspect.Parameter]
    catch_all: bool
    readable: bool = True


@functools.lru_cache(maxsize=256)
def constructor_of(cls: type) -> Constructor:
    """The keyword parameters of ``cls(...)``; positional-only ones cannot be given by name and are left out."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return Constructor({}, catch_all=True, readable=False)
    params = signature.parameters.values()
    keyword = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return Constructor(keyword, catch_all=any(p.kind is p.VAR_KEYWORD for p in params))


@functools.lru_cache(maxsize=256)
def _hints(cls: type) -> dict[str, Any]:
    try:
        init = next(vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))
        return typing.get_type_hints(init)
    except Exception:  # an unresolvable name (TYPE_CHECKING-only import) or a broken annotation
        return {}


@functools.lru_cache(maxsize=1024)
def _adapter(annotation: Any) -> TypeAdapter[Any] | None:
    if annotation is Any or annotation is inspect.Parameter.empty:
        return None
    try:
        return TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:  # pydantic cannot build a check for this type
        return None


def _accepted_conversion(value: Any, converted: Any) -> bool:
    """A lax-mode conversion a constructor handles like the original: list to tuple/set, text to Path."""
    if isinstance(value, list) and isinstance(converted, (tuple, set, frozenset)):
        return True
    return isinstance(value, str) and isinstance(converted, PurePath)


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _value_problem(adapter: TypeAdapter[Any], value: Any) -> str | None:
    """Why ``value`` does not fit the annotation, or None if it does."""
    try:
        adapter.validate_python(value, strict=True)
        return None
    except ValidationError as strict_error:
        reason: str = strict_error.errors()[0]["msg"]
    try:
        converted = adapter.validate_python(value)
    except ValidationError:
        return reason
    return None if _accepted_conversion(value, converted) else reason


def kwargs_type_problems(name: str, cls: type, kwargs: Mapping[Any, Any]) -> list[tuple[str, str]]:
    """(key, message) for each value of ``kwargs`` that does not fit the annotation of the parameter it names.

    Keys that name no parameter are left to the check of names
    (:func:`telescope.config.checks.environment_kwargs_problems`).
    """
    hints = _hints(cls)
    keyword = constructor_of(cls).keyword
    problems: list[tuple[str, str]] = []
    for key, value in kwargs.items():
        if not isinstance(key, str) or key not in keyword or key not in hints:
            continue
        adapter = _adapter(hints[key])
        reason = _value_problem(adapter, value) if adapter is not None else None
        if adapter is None or reason is None:
            continue
        quoted = isinstance(value, str) and _value_problem(adapter, _unquoted(value)) is None
        as_number = number_text_hint(key, value, cli=False)
        fix = f"; write it without quotes: {key}: {value}" if quoted else (f"; {as_number}" if as_number else "")
        message = (
            f"environment {name!r}: {key} = {value!r} ({type(value).__name__}) does not fit "
            f"{cls.__name__}'s {key}: {_type_name(hints[key])} ({reason}){fix}"
        )
        problems.append((key, message))
    return problems


def _unquoted(text: str) -> Any:
    """What YAML makes of ``text`` written without quotes (the text itself if that is not a scalar)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text
