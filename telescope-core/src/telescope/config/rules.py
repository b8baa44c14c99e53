"""Config rules that need the plugin registry: names and algorithm capabilities.

Checked after the schema's own rules, before anything starts: plugin names and
algorithm capabilities, the ``model`` (a local folder must exist and hold
``config.json``; see :mod:`telescope.config.checks`), every environment's and
eval's ``kwargs`` against its constructor (names, and values against the annotations:
:mod:`telescope.config.constructors`), the local data files they name
(:mod:`telescope.config.data_files`), and ``inference_tensor_parallel_size`` against
the embedded inference engine, which runs each server on one device. Each problem is one message naming the
fields, the value and how to fix it. Algorithm capabilities are read from
registration metadata or the class attributes, never by importing torch.

Environments (and evals) are checked for what they declare they need
(:func:`environment_needs_problems`): every module of their ``requires`` must be
importable, an environment that ``uses_sandbox`` must find its sandbox provider
(its own ``sandbox_provider`` keyword argument, else the run's ``sandbox_provider``)
registered and installed, and one that ``uses_browser`` its browser provider the same
way (``browser_provider``): a provider registered with ``requires`` metadata (the
remote providers' SDK modules) is not installed while one of those modules is missing,
and the message names the provider and the ``pip install`` that adds it. What an
environment needs is checked once per list, environment and provider override, however
many entries name it. The run's
``sandbox_provider`` and ``browser_provider`` are checked the same way when the user set
them; left at their defaults and used by no environment, they are not checked, so that
telescope-core works without telescope-sandbox for environments that need neither.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from telescope.api.algorithm import AlgorithmCapabilities
from telescope.config.checks import environment_kwargs_problems, model_problems
from telescope.config.constructors import kwargs_type_problems
from telescope.config.data_files import data_file_kwargs_problems
from telescope.plugins.registry import PluginError, PluginKind, Registry
from telescope.schema.config import TelescopeConfig

if TYPE_CHECKING:
    from telescope.plugins.facade import Plugins

#: Values of plugin-chosen fields that are resolved at run time, not registered names.
AUTO = "auto"


def algorithm_capabilities(registry: Registry, name: str) -> AlgorithmCapabilities:
    """Capabilities of a registered algorithm (from metadata if lazy, else the class)."""
    entry = registry.entry(PluginKind.ALGORITHM, name)
    if entry.is_lazy:
        return AlgorithmCapabilities.from_metadata(entry.metadata)
    caps = getattr(entry.target, "capabilities", None)
    return caps if isinstance(caps, AlgorithmCapabilities) else AlgorithmCapabilities()


def _check_name(
    registry: Registry, kind: PluginKind, value: str, field: str, problems: list[str], *, allow_auto: bool = False
) -> bool:
    if allow_auto and value == AUTO:
        return True
    try:
        registry.entry(kind, value)  # an unknown name, or one that two packages register
    except PluginError as exc:
        problems.append(f"{field}: {exc}")
        return False
    return True


#: ``{field: (value, reason)}``: a value resolved after validation, and why (shown by ``telescope config show``).
Derived = dict[str, tuple[Any, str]]


def registry_problems(config: TelescopeConfig, plugins: Plugins, derived: Derived) -> list[str]:
    """Check names and capabilities; resolve capability-dependent defaults.

    Fills ``derived`` with each value resolved here; the config itself is frozen, the
    loader makes the resolved config from it (``model_copy(update=...)``).
    """
    registry = plugins.registry
    problems: list[str] = []
    for i, env in enumerate(config.environments):
        _check_name(registry, PluginKind.ENVIRONMENT, env.name, f"environments[{i}].name", problems)
    for i, ev in enumerate(config.evals):
        if not (registry.has(PluginKind.EVAL, ev.name) or registry.has(PluginKind.ENVIRONMENT, ev.name)):
            message = registry.unknown_name_message(PluginKind.EVAL, ev.name)
            envs = registry.names(PluginKind.ENVIRONMENT)
            if envs:
                message += f" Environments can be evaluated by name too: {', '.join(envs)}."
            problems.append(f"evals[{i}].name: {message}")
    _check_name(registry, PluginKind.TRAINER_BACKEND, config.train_backend, "train_backend", problems)
    _check_name(
        registry, PluginKind.INFERENCE_BACKEND, config.inference_backend, "inference_backend", problems, allow_auto=True
    )
    _check_name(
        registry, PluginKind.WEIGHT_TRANSPORT, config.weight_transport, "weight_transport", problems, allow_auto=True
    )
    if config.compaction != "none":
        _check_name(registry, PluginKind.COMPACTION, config.compaction, "compaction", problems)
    for kind, (setting, _) in PROVIDER_KINDS.items():
        if setting in config.model_fields_set:
            problems.extend(provider_problems(registry, kind, str(getattr(config, setting)), setting))

    problems.extend(model_problems(config.model))
    problems.extend(embedded_tensor_parallel_problems(config))
    entries: list[tuple[str, str, Any, dict[str, Any]]] = []  # (where, name, class, kwargs)
    environments = set(registry.names(PluginKind.ENVIRONMENT))
    classes = {name: plugins.environment(name) for name in {env.name for env in config.environments} & environments}
    for i, env in enumerate(config.environments):
        if env.name in classes:
            entries.append((f"environments[{i}]", env.name, classes[env.name], env.kwargs))
    for i, ev in enumerate(config.evals):
        if ev.name in registry.names(PluginKind.EVAL):
            spec = plugins.eval_spec(ev.name)
            entries.append((f"evals[{i}]", ev.name, spec.environment, {**spec.default_kwargs, **ev.kwargs}))
        elif ev.name in registry.names(PluginKind.ENVIRONMENT):
            entries.append((f"evals[{i}]", ev.name, plugins.environment(ev.name), ev.kwargs))
    for where, name, cls, kwargs in entries:
        problems.extend(f"{where}.kwargs: {p}" for p in environment_kwargs_problems(name, cls, kwargs))
        problems.extend(f"{where}.kwargs.{key}: {p}" for key, p in kwargs_type_problems(name, cls, kwargs))
        problems.extend(f"{where}.kwargs: {p}" for p in data_file_kwargs_problems(name, cls, kwargs))
    for name, cls, kwargs, where in _distinct_needs(entries):
        problems.extend(environment_needs_problems(config, registry, where, name, cls, kwargs))
    if _check_name(registry, PluginKind.ALGORITHM, config.algorithm, "algorithm", problems):
        problems.extend(_algorithm_problems(config, algorithm_capabilities(registry, config.algorithm), derived))
    return problems


def _distinct_needs(
    entries: list[tuple[str, str, Any, dict[str, Any]]],
) -> list[tuple[str, Any, dict[str, Any], str]]:
    """The first entry of each list, environment and provider overrides: the others need the same."""
    first: dict[tuple[str, str, str, str], tuple[str, Any, dict[str, Any], str]] = {}
    for where, name, cls, kwargs in entries:
        key = (where.partition("[")[0], name, str(kwargs.get("sandbox_provider")), str(kwargs.get("browser_provider")))
        first.setdefault(key, (name, cls, kwargs, where))
    return list(first.values())


def embedded_tensor_parallel_problems(config: TelescopeConfig) -> list[str]:
    """``inference_tensor_parallel_size`` > 1 where the servers are the embedded engine, which uses one device.

    The embedded backend is the one chosen by ``inference_backend: embedded``, and by
    ``auto`` when vLLM is not installed here (``auto`` picks vLLM only when it is
    installed and the workers have GPUs; that last part is known only once the run
    has its cluster, so ``auto`` with vLLM installed is not refused).
    """
    size = config.inference_tensor_parallel_size
    if size == 1:
        return []
    chosen = config.inference_backend == "embedded"
    if not chosen and not (config.inference_backend == AUTO and not module_installed("vllm")):
        return []
    how = "inference_backend: embedded" if chosen else "inference_backend: auto, without vLLM installed,"
    return [
        f"inference_tensor_parallel_size ({size}) > 1 needs the vllm inference backend: with {how} each "
        f"inference server is the embedded engine, which runs on one device (it would hold {size} GPUs and "
        "use one); set inference_tensor_parallel_size: 1, or inference_backend: vllm "
        "(pip install 'telescope-core[vllm]', a CUDA GPU is needed)"
    ]


def module_installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


#: Per provider kind: its setting, and what installs the built-in providers (the message when none is).
PROVIDER_KINDS: dict[PluginKind, tuple[str, str]] = {
    PluginKind.SANDBOX_PROVIDER: (
        "sandbox_provider",
        "telescope-sandbox (pip install telescope-sandbox, or pip install 'telescope-envs[code]'), "
        "which provides 'local' and the remote providers",
    ),
    PluginKind.BROWSER_PROVIDER: (
        "browser_provider",
        "telescope-sandbox with Playwright (pip install 'telescope-sandbox[browser]'), which provides 'local'",
    ),
}


def provider_problems(registry: Registry, kind: PluginKind, name: str, field: str) -> list[str]:
    """Problems with provider ``name`` of ``kind`` chosen by ``field``: unknown, clashing, or not installed."""
    if not registry.names(kind) and not registry.has(kind, name):
        installs = PROVIDER_KINDS[kind][1]
        return [f"{field}: {kind.label} {name!r} is not installed: no {kind.label} is. Install {installs}"]
    try:
        entry = registry.entry(kind, name)
    except PluginError as exc:
        return [f"{field}: {exc}"]
    required = entry.metadata.get("requires")
    if required is None and not entry.is_lazy:
        required = getattr(entry.target, "requires", ())
    modules = [required] if isinstance(required, str) else list(required or ())
    missing = [m for m in modules if not module_installed(m)]
    if not missing:
        return []
    hint = entry.metadata.get("install_hint") or f"pip install {' '.join(missing)}"
    return [
        f"{field}: {kind.label} {name!r} (from {entry.provider}) is not installed: it needs the "
        f"{', '.join(repr(m) for m in missing)} package, which is missing. Install it with: {hint}"
    ]


def environment_needs_problems(
    config: TelescopeConfig, registry: Registry, where: str, name: str, cls: Any, kwargs: Mapping[str, Any]
) -> list[str]:
    """What environment ``name`` (class ``cls``, entry ``where``) declares it needs but is missing.

    Its ``requires`` modules; when it ``uses_sandbox``, the sandbox provider it will use
    (``kwargs["sandbox_provider"]`` when given, else the run's ``sandbox_provider``); when it
    ``uses_browser``, the browser provider, the same way.
    """
    problems = [
        f"{where}: environment {name!r} needs the {module!r} package, which is not installed. Install it with: {hint}"
        for module, hint in dict(getattr(cls, "requires", None) or {}).items()
        if not module_installed(module)
    ]
    if problems:
        return problems
    for kind, flag in ((PluginKind.SANDBOX_PROVIDER, "uses_sandbox"), (PluginKind.BROWSER_PROVIDER, "uses_browser")):
        if not getattr(cls, flag, False):
            continue
        setting = PROVIDER_KINDS[kind][0]
        override = kwargs.get(setting)
        if override:
            problems.extend(provider_problems(registry, kind, str(override), f"{where}.kwargs.{setting} ({name})"))
        elif setting not in config.model_fields_set:  # a setting the user set is checked once, as the run's own
            chosen = str(getattr(config, setting))
            problems.extend(
                provider_problems(registry, kind, chosen, f"{setting} (the default, used by {where}: {name})")
            )
    return problems


def _algorithm_problems(config: TelescopeConfig, caps: AlgorithmCapabilities, derived: Derived) -> list[str]:
    problems: list[str] = []
    name = config.algorithm
    if config.use_ppo_clip and not caps.supports_ppo_clip:
        problems.append(
            f"use_ppo_clip=true cannot be combined with algorithm={name!r}, whose loss already "
            "bounds the ratio; PPO clipping combines with grpo, rloo, reinforce_pp and dr_grpo"
        )
    if config.clip_ratio_c is not None and not (config.use_ppo_clip or caps.clipped_ratio):
        problems.append(
            f"clip_ratio_c (dual clip) bounds a PPO-clipped ratio loss, which algorithm={name!r} does not "
            "have here: set use_ppo_clip=true (grpo, rloo, reinforce_pp, dr_grpo), use gspo, or "
            "clip_ratio_c: null"
        )
    if config.use_tis and caps.ratio_based and config.ppo_clip_ref_logprobs == "rollout":
        problems.append(
            f"use_tis=true with algorithm={name!r} and ppo_clip_ref_logprobs='rollout' counts the "
            "importance-sampling correction twice (the loss's ratio already uses the rollout "
            "log-probabilities); set ppo_clip_ref_logprobs: batch or use_tis: false"
        )
    if config.advantage_norm is None:
        derived["advantage_norm"] = (caps.default_advantage_norm, f"default of algorithm {name!r}")
    elif config.advantage_norm not in caps.advantage_norms:
        allowed = " or ".join(repr(n) for n in caps.advantage_norms)
        problems.append(
            f"advantage_norm={config.advantage_norm!r} is not supported by algorithm={name!r}, "
            f"which requires {allowed}; remove advantage_norm to use the algorithm's default"
        )
    if caps.group_based and config.group_size < 2:
        problems.append(
            f"group_size={config.group_size}: algorithm={name!r} compares samples within a prompt "
            "group, so group_size must be at least 2"
        )
    return problems
