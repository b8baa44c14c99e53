"""Checks of config values against the world outside the schema: model folders, constructors.

Pure functions returning one user-facing message per problem (an empty list when
all is well), for validation to call; nothing here raises for bad input, imports
torch or transformers, or touches the network.

- :func:`model_problems`: ``model`` is ``tiny:<preset>``, a local folder, or a
  Hugging Face hub id. A value that looks like a path (absolute, starting with
  ``.`` or ``~``, an existing relative path, or not shaped like ``org/name``) must be
  a folder holding ``config.json``. A hub id that is not a local folder is
  accepted: it is downloaded at run time; except that ``telescope run`` with
  ``HF_HUB_OFFLINE`` set requires it in the local Hugging Face cache, since
  nothing can be downloaded (``hub_cache=True``). Limits: only the presence of ``config.json`` is checked (not the
  weights or the tokenizer); a hub id is never checked online; the cache is found
  from ``HF_HUB_CACHE``, ``HF_HOME`` or ``XDG_CACHE_HOME`` as the hub library does.
- :func:`environment_kwargs_problems`: the keys of an environment entry's
  ``kwargs`` against its class's constructor signature: unknown names (with
  suggestions) and missing required ones. A ``**kwargs`` catch-all means any
  name may be accepted, so nothing can be said about unknown names: an
  environment that wants its typos caught at validate time names its keyword
  arguments (as every telescope-envs environment does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from telescope.config.constructors import constructor_of
from telescope.config.spelling import closest

#: A Hugging Face hub id: ``name`` or ``org/name`` (letters, digits, ``-``, ``_``, ``.``).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_TRUE = {"1", "on", "yes", "true"}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the same variables the hub library reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "huggingface" / "hub"


def _in_hf_cache(repo_id: str) -> bool:
    """Whether some cached snapshot of ``repo_id`` holds a ``config.json``."""
    snapshots = hf_cache_dir() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any((snapshot / "config.json").is_file() for snapshot in snapshots.iterdir())


def _looks_local(model: str) -> bool:
    if model.startswith(("/", ".", "~")) or Path(model).expanduser().exists():
        return True
    return _HUB_ID.fullmatch(model) is None


def model_problems(model: str, *, hub_cache: bool = False) -> list[str]:
    """Problems with a ``model`` value (see the module doc); [] if it can be loaded as far as can be told.

    ``hub_cache``: also require a hub id to be in the local cache when ``HF_HUB_OFFLINE``
    is set (what ``telescope run`` checks before it starts anything; validating a
    config for another machine should not depend on this one's cache).
    """
    from telescope.models.tiny import PRESETS, TINY_PREFIX  # light: no torch at import

    if model.startswith(TINY_PREFIX):
        preset = model[len(TINY_PREFIX) :]
        if preset in PRESETS:
            return []
        available = ", ".join(f"{TINY_PREFIX}{name}" for name in PRESETS)
        return [f"model: unknown tiny model preset {preset!r}; available: {available}"]
    if not model.strip():
        return ["model is empty: give a Hugging Face model id (org/name) or the folder of a saved model"]
    if _looks_local(model):
        path = Path(model).expanduser()
        shown = f"{model} ({path.resolve()})" if str(path.resolve()) != model else model
        if not path.exists():
            return [
                f"model: {shown} does not exist; give the folder of a saved model (holding config.json) "
                "or a Hugging Face model id such as Qwen/Qwen2.5-3B"
            ]
        if not path.is_dir():
            return [f"model: {shown} is a file; give the folder that holds the model's config.json"]
        if not (path / "config.json").is_file():
            inside = sorted(str(p.parent) for p in path.glob("*/config.json"))[:3]
            hint = f" (these folders inside hold one: {', '.join(inside)})" if inside else ""
            return [
                f"model: {shown} holds no config.json, so it is not a saved Hugging Face model{hint}; "
                "point at the folder written by save_pretrained"
            ]
        return []
    if hub_cache and _offline() and not _in_hf_cache(model):
        return [
            f"model: {model!r} is not in the local Hugging Face cache ({hf_cache_dir()}) and HF_HUB_OFFLINE "
            f"is set, so nothing can be downloaded; download it first (huggingface-cli download {model}), "
            "point model at a local folder, or unset HF_HUB_OFFLINE"
        ]
    return []


def environment_kwargs_problems(
    name: str,
    cls: type,
    kwargs: Mapping[Any, Any],
) -> list[str]:
    """Unknown and missing constructor keyword arguments of environment ``name`` (class ``cls``).

    Found from ``inspect.signature(cls)`` (read once per class); see the module doc for ``**kwargs``
    catch-alls. Positional-only parameters cannot be given as
    keywords, so they count as unknown. [] when the signature cannot be read.
    """
    constructor = constructor_of(cls)
    if not constructor.readable:
        return []
    keyword, catch_all = constructor.keyword, constructor.catch_all
    takes = ", ".join(keyword) or "no keyword arguments"
    problems: list[str] = []
    if not catch_all:
        for key in kwargs:
            if key in keyword:
                continue
            if not isinstance(key, str):
                what = "null" if key is None else type(key).__name__.replace("bool", "boolean")
                problems.append(
                    f"environment {name!r}: kwargs key {key!r} is read by YAML as a {what}, not a name "
                    f"(quote it if it is meant); {cls.__name__} takes: {takes}"
                )
                continue
            hint = closest(key, list(keyword))
            problems.append(
                f"environment {name!r}: unknown keyword argument {key!r} in kwargs{hint} "
                f"({cls.__name__} takes: {takes})"
            )
    for param in keyword.values():
        if param.default is param.empty and param.name not in kwargs:
            problems.append(f"environment {name!r}: kwargs needs {param.name!r} ({cls.__name__} has no default for it)")
    return problems
