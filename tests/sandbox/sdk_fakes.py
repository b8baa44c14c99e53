"""Fakes of the remote sandbox SDKs that reject every call the real SDK would reject.

:func:`sdk_fake` is ``unittest.mock.create_autospec`` of an SDK class, with three gaps
of plain autospec closed:

- methods that are not plain functions (modal's synchronicity wrappers, e2b's
  ``class_method_variant``) get a stub carrying the SDK's ``inspect.signature``, so their
  arguments are checked too (plain autospec accepts anything for them);
- ``**opts: Unpack[SomeTypedDict]`` (e2b) becomes the TypedDict's keywords, so an unknown
  keyword fails instead of vanishing into ``**opts``;
- properties whose annotated return type is a class of the same SDK (``sandbox.commands``,
  ``sandbox.fs``, ``process.stdout``) become fakes of that class (plain autospec leaves
  them as unchecked ``MagicMock``\\ s).

Attribute values given as keywords (``sandbox_id="e-1"``, ``returncode=0``) must name an
attribute, property or pydantic field the SDK class has, so a renamed one fails as well.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any
from unittest.mock import create_autospec


def _expand_unpacked_kwargs(signature: inspect.Signature) -> inspect.Signature:
    """``**opts: Unpack[TD]`` -> one keyword-only parameter per key of ``TD``."""
    params = list(signature.parameters.values())
    if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        return signature
    annotation = params[-1].annotation
    if typing.get_origin(annotation) is not typing.Unpack:
        return signature
    (typed_dict,) = typing.get_args(annotation)
    taken = {p.name for p in params}
    keywords = [
        inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None)
        for key in typing.get_type_hints(typed_dict)
        if key not in taken
    ]
    return signature.replace(parameters=[*params[:-1], *keywords])


def signature_checked(name: str, signature: inspect.Signature) -> Any:
    """An autospec'd function with ``signature``: a call that does not bind raises TypeError."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("replaced by create_autospec")

    stub.__name__ = stub.__qualname__ = name
    stub.__signature__ = _expand_unpacked_kwargs(signature)  # type: ignore[attr-defined]
    return create_autospec(stub)


def _property_class(prop: property, sdk_root: str) -> type | None:
    """The class a property is annotated to return, when it belongs to the same SDK."""
    try:
        returned = typing.get_type_hints(prop.fget).get("return")
    except Exception:  # unresolvable forward references: leave the property alone
        return None
    returned = typing.get_origin(returned) or returned
    if inspect.isclass(returned) and returned.__module__.split(".")[0] == sdk_root:
        return returned
    return None


def _has_attribute(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in getattr(cls, "model_fields", {})


def sdk_fake(cls: type, /, *, instance: bool = True, depth: int = 1, **attributes: Any) -> Any:
    """A fake of ``cls`` (an instance, or the class with its class-level methods) checking the SDK's signatures.

    ``depth``: how many levels of SDK-typed properties become fakes themselves.
    ``attributes``: values for attributes/properties/fields (each must exist on ``cls``).
    """
    fake = create_autospec(cls, instance=instance)
    sdk_root = cls.__module__.split(".")[0]
    for name in dir(cls):
        if name.startswith("_") or name in attributes:
            continue
        static = inspect.getattr_static(cls, name, None)
        if isinstance(static, property):
            returned = _property_class(static, sdk_root) if depth > 0 else None
            if returned is not None:
                setattr(fake, name, sdk_fake(returned, depth=depth - 1))
            continue
        try:
            member = getattr(cls, name)
            signature = inspect.signature(member) if callable(member) and not inspect.isclass(member) else None
        except (AttributeError, TypeError, ValueError):
            continue
        if signature is None:
            continue
        params = list(signature.parameters.values())
        takes_self = bool(params) and params[0].name == "self"
        if takes_self and not instance:
            continue  # an instance method, looked up on the class: not called through the class fake
        if takes_self:
            signature = signature.replace(parameters=params[1:])
        setattr(fake, name, signature_checked(name, signature))
    for name, value in attributes.items():
        if not _has_attribute(cls, name):
            raise AttributeError(f"{cls.__module__}.{cls.__qualname__} has no attribute {name!r}")
        setattr(fake, name, value)
    return fake


def assert_same_parameters(stand_in: Any, sdk_function: Any) -> None:
    """A hand-written stand-in for an SDK method takes the SDK's leading parameters, in order.

    The SDK may take more, all with defaults (the stand-in is then called as the provider calls the SDK).
    """
    mine = list(inspect.signature(stand_in).parameters.values())
    theirs = list(inspect.signature(sdk_function).parameters.values())
    assert [p.name for p in mine] == [p.name for p in theirs[: len(mine)]], (
        f"{stand_in.__qualname__}{inspect.signature(stand_in)} != SDK {inspect.signature(sdk_function)}"
    )
    extra = [
        p.name
        for p in theirs[len(mine) :]
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    assert not extra, f"the SDK's {sdk_function.__qualname__} requires {extra}"
