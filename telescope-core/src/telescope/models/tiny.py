"""Tiny causal LMs and tokenizers built locally, in the Hugging Face format.

What runs on a laptop or in CI must not download anything, so Telescope builds
its own small model: a byte-level BPE tokenizer trained on a generated corpus
(arithmetic, digits, a little English and the chat markup), with a ChatML chat
template, and a randomly initialised Qwen2-architecture model sized from a
config. Both are written with ``save_pretrained``, so the same
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` code
that loads ``Qwen/Qwen2.5-3B`` loads them.

``model: "tiny:<preset>"`` in a config builds the preset on first use into
``$TELESCOPE_CACHE`` (default ``~/.cache/telescope``) and reuses it afterwards;
``telescope tiny-model build DIR`` builds one into a chosen folder. Building is
deterministic for a given preset and seed.

Limits: these models know nothing until trained; they exist to exercise the real
code paths (packing, FSDP, the engine, weight sync) quickly, and to show learning
on simple tasks (countdown with small numbers) in minutes on a CPU.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TINY_PREFIX = "tiny:"
#: Part of a cached preset's folder name; raised when what a build writes changes (its chat template),
#: so a cache built by an older version is not reused.
BUILD_REVISION = 2

#: ChatML. Given ``tools``, it lists their schemas in the system turn and asks for calls as
#: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes/Qwen2.5 markup, so the
#: gateway's ``hermes`` parser reads this model's calls as it reads Qwen's); an assistant turn's
#: ``tool_calls`` render in that markup, a ``tool`` turn as the ``tool`` role. Without tools, a
#: conversation renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ 'Tools you can call, as JSON schemas:\n<tools>' }}"
    "{%- for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    '{{ \'\n</tools>\nTo call a tool, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.\''
    " + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>{\"name\": \"' + function['name'] + '\", \"arguments\": ' }}"
    "{%- if function['arguments'] is string %}{{ function['arguments'] }}"
    "{%- else %}{{ function['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of a tiny Qwen2-architecture model and its tokenizer."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0


PRESETS: dict[str, TinyModelSpec] = {
    # ~0.1M parameters: unit tests.
    "test": TinyModelSpec(),
    # ~0.84M parameters: the CPU quick start (learns small countdown problems).
    "small": TinyModelSpec(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4),
    # ~6.4M parameters: the larger configuration of bench/bench_vs_trl.py.
    "medium": TinyModelSpec(
        hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
    ),
}


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Text the tokenizer is trained on: numbers, equations, words, chat markup."""
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "an",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "you",
        "that",
        "for",
        "on",
        "with",
        "as",
        "are",
        "this",
        "be",
        "at",
        "have",
        "or",
        "from",
        "by",
        "answer",
        "equation",
        "using",
        "numbers",
        "create",
        "equal",
        "target",
        "each",
        "number",
        "once",
        "only",
        "use",
        "think",
        "step",
        "solve",
        "result",
        "final",
        "please",
        "show",
        "work",
        "your",
        "reasoning",
        "user",
        "assistant",
        "system",
        "tool",
        "call",
        "add",
        "subtract",
        "guess",
        "word",
        "letter",
        "correct",
        "wrong",
        "true",
        "false",
        "yes",
        "no",
    ]
    out: list[str] = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.45:
            nums = [str(rng.randint(0, 100)) for _ in range(rng.randint(2, 4))]
            ops = [rng.choice("+-*/") for _ in range(len(nums) - 1)]
            expr = nums[0] + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:], strict=True))
            out.append(f"<answer>({expr})</answer> = {rng.randint(0, 200)}")
        elif kind < 0.85:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + ".")
        else:
            out.append(f"<|im_start|>{rng.choice(['user', 'assistant', 'system'])}\n{rng.choice(words)}<|im_end|>")
    return out


def build_tokenizer(spec: TinyModelSpec) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(spec: TinyModelSpec, vocab_size: int, eos_token_id: int, pad_token_id: int) -> Any:
    """A randomly initialised Qwen2 causal LM of the given sizes (float32)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def build_tiny_model(path: str | Path, spec: TinyModelSpec | None = None, replace: bool = True) -> Path:
    """Build a tokenizer and model and save both to ``path`` (Hugging Face format).

    The folder appears whole (built aside, then renamed). ``replace=False`` keeps a
    model that another process put at ``path`` meanwhile (two runs building one preset).
    """
    spec = spec or PRESETS["test"]
    path = Path(path)
    tokenizer = build_tokenizer(spec)
    model = build_model(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.parent.mkdir(parents=True, exist_ok=True)
    # a folder of our own: two runs building the same model at once never write into one folder
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "telescope_tiny.json").write_text(__import__("json").dumps(asdict(spec)), encoding="utf-8")
        if not replace and (path / "config.json").exists():
            return path  # another process built it meanwhile (the same spec: the same files); keep it
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)  # replaced (or a broken folder, without config.json)
        try:
            tmp.rename(path)
        except OSError:  # another process renamed its build there first
            if not (path / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("TELESCOPE_CACHE", Path.home() / ".cache" / "telescope"))


def resolve_model_path(model: str) -> str:
    """Turn ``tiny:<preset>`` into a local folder (building it once); pass others through."""
    if not model.startswith(TINY_PREFIX):
        return model
    preset = model[len(TINY_PREFIX) :]
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}; available: {', '.join(PRESETS)}")
    path = cache_dir() / "tiny-models" / f"{preset}-{BUILD_REVISION}"
    if not (path / "config.json").exists():
        build_tiny_model(path, PRESETS[preset], replace=False)
    return str(path)
