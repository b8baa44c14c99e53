"""The tiny models' chat template: plain ChatML without tools, the Hermes tool markup with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from telescope.inference.gateway.tool_parsers import parse_hermes
from telescope.models.tiny import BUILD_REVISION, PRESETS, build_tokenizer, resolve_model_path

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


def test_without_tools_a_conversation_is_plain_chatml(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"


def test_tools_and_calls_render_in_the_hermes_markup(tokenizer: Any) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "1"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\ns\n\n") and json.dumps(TOOLS[0]) in system
    assert "<|im_start|>system" not in rest  # the system message went into the tools turn, once
    assistant = rest.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    parsed = parse_hermes(assistant)  # what the gateway parses is what the template writes
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("add", {"a": 1})]
    assert rest.endswith("<|im_start|>tool\n1<|im_end|>\n")


def test_a_cached_preset_of_an_older_build_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELESCOPE_CACHE", str(tmp_path))
    old = tmp_path / "tiny-models" / "test"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}", encoding="utf-8")  # a build from before the tool template
    path = Path(resolve_model_path("tiny:test"))
    assert path.name == f"test-{BUILD_REVISION}" and (path / "tokenizer_config.json").is_file()
