"""Meta-tests: every hook is documented in docs/hooks.md, and the run calls every lifecycle hook.

(a) The hook specs (functions of ``telescope/plugins/hookspecs.py`` decorated with
``@hookspec``) and the hook sections of docs/hooks.md (headings
``telescope_<name>(<parameters>)``) must name the same hooks with the same
parameters; each section must describe every parameter and show an example that
implements the hook (the examples themselves run in test_examples.py).

(b) A real run (``launch_run`` over fake workers, see :mod:`fake_run`) must call
``telescope_run_start``, then ``telescope_step_end`` once per step with that step's
recorded metrics, then ``telescope_run_end`` with the final status, also when the run
fails.
"""

from __future__ import annotations

import ast
import gc
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from docs_harness import DOCS, REPO
from fake_run import FakeWorkers, run_with_fake_workers

from telescope import hookimpl

HOOKSPECS = REPO / "telescope-core" / "src" / "telescope" / "plugins" / "hookspecs.py"
HOOKS_MD = DOCS / "hooks.md"
_HEADING = re.compile(r"^(#{2,4}) `?(telescope_\w+)\(([^)]*)\)`?\s*$")


def hook_specs(source: str) -> dict[str, list[str]]:
    """``{hook name: parameter names}`` of the functions decorated with ``@hookspec``."""
    specs: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("telescope_"):
            continue
        decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if any(isinstance(d, ast.Name) and d.id == "hookspec" for d in decorators):
            specs[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
    return specs


def documented_hooks(markdown: str) -> dict[str, tuple[list[str], str]]:
    """``{hook name: (parameter names, section text)}`` from the hook headings of docs/hooks.md."""
    sections: dict[str, tuple[list[str], str]] = {}
    current: str | None = None
    level = 0
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else _HEADING.match(line)
        heading = None if in_code else re.match(r"^(#+) ", line)
        if match:
            name, params = match.group(2), [p.strip() for p in match.group(3).split(",") if p.strip()]
            assert name not in sections, f"docs/hooks.md documents {name} twice"
            current, level = name, len(match.group(1))
            sections[name] = (params, "")
        elif heading and current is not None and len(heading.group(1)) <= level:
            current = None  # a heading of the same or a higher level ends the section
        elif current is not None:
            params, text = sections[current]
            sections[current] = (params, text + line + "\n")
    return sections


def test_hookspecs_parse() -> None:
    specs = hook_specs(HOOKSPECS.read_text(encoding="utf-8"))
    assert specs["telescope_run_end"] == ["run_dir", "status", "error"]
    assert len(specs) >= 13


def test_every_hook_has_a_section_with_its_parameters_and_an_example() -> None:
    specs = hook_specs(HOOKSPECS.read_text(encoding="utf-8"))
    documented = documented_hooks(HOOKS_MD.read_text(encoding="utf-8"))
    missing = sorted(set(specs) - set(documented))
    assert not missing, f"hooks without a section in docs/hooks.md: {missing}"
    unknown = sorted(set(documented) - set(specs))
    assert not unknown, f"docs/hooks.md documents hooks that hookspecs.py does not have: {unknown}"
    for name, params in specs.items():
        shown, text = documented[name]
        assert shown == params, f"docs/hooks.md shows {name}({', '.join(shown)}), the spec is ({', '.join(params)})"
        for param in params:
            assert f"`{param}`" in text, f"the section of {name} does not describe its parameter `{param}`"
        for topic in ("Returns", "Called"):
            assert f"**{topic}**" in text, f"the section of {name} has no **{topic}** paragraph"
        assert re.search(rf"^```python\n(?:.*\n)*?def {name}\(", text, re.M), (
            f"the section of {name} has no example that implements it"
        )


def test_the_section_check_fails_on_a_missing_or_an_unknown_hook() -> None:
    """The checks above compare both ways: prove it on edited copies."""
    specs = hook_specs(HOOKSPECS.read_text(encoding="utf-8"))
    text = HOOKS_MD.read_text(encoding="utf-8")
    without = re.sub(r"^### `telescope_run_start\(", "### `removed_run_start(", text, flags=re.M)
    assert "telescope_run_start" not in documented_hooks(without)
    extra = text + "\n### `telescope_run_paused(run_dir)`\n\n`run_dir` ...\n"
    assert set(documented_hooks(extra)) - set(specs) == {"telescope_run_paused"}
    source = HOOKSPECS.read_text(encoding="utf-8")
    added = source + "\n\n@hookspec\ndef telescope_eval_end(name: str) -> None:\n    pass\n"
    assert set(hook_specs(added)) - set(documented_hooks(text)) == {"telescope_eval_end"}


# ------------------------------------------------------------------------ (b) the run calls them


class LifecycleProbe:
    """Records every lifecycle call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    @hookimpl
    def telescope_run_start(self, config: Any, run_dir: Path) -> None:
        self.calls.append(("run_start", Path(run_dir), config.number_of_steps))

    @hookimpl
    def telescope_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.calls.append(("step_end", step, dict(metrics)))

    @hookimpl
    def telescope_run_end(self, run_dir: Path, status: str, error: BaseException | None) -> None:
        self.calls.append(("run_end", Path(run_dir), status, error))


def recorded_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the keys the store adds."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("step", "time", "attempt")} for line in lines]


def same_metrics(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return bool(x == y)

    return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_run_calls_every_lifecycle_hook_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = LifecycleProbe()
    run_dir = tmp_path / "run"
    assert run_with_fake_workers(monkeypatch, run_dir, {"lifecycle-probe": probe}) == 0
    names = [call[0] for call in probe.calls]
    assert names == ["run_start", "step_end", "step_end", "run_end"], names
    assert probe.calls[0] == ("run_start", run_dir, 2)
    recorded = recorded_metrics(run_dir)
    for step, call in enumerate(probe.calls[1:3]):
        assert call[1] == step
        assert "reward/mean" in call[2] and same_metrics(call[2], recorded[step]), "step_end got other metrics"
    assert probe.calls[3] == ("run_end", run_dir, "completed", None)
    assert gc.get_freeze_count() == 0  # the orchestrator froze its start-up objects and thawed them at the end


@pytest.mark.slow
def test_a_failed_run_still_ends_with_run_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = LifecycleProbe()
    monkeypatch.setattr(FakeWorkers, "fail_at_step", 1)
    assert run_with_fake_workers(monkeypatch, tmp_path / "run", {"lifecycle-probe": probe}) == 1
    assert [call[0] for call in probe.calls] == ["run_start", "step_end", "run_end"]
    _, _, status, error = probe.calls[-1]
    assert status == "failed" and isinstance(error, RuntimeError) and "fails at step 1" in str(error)
