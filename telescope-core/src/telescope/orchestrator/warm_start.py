"""Supervised warm start: a few steps of fine-tuning on environment demonstrations before RL.

A randomly initialised tiny model never writes a well-formed answer, so every
group gets the same (zero) reward and RL has nothing to learn from. With
``warm_start_steps > 0`` the run first fine-tunes the initial model on the
environments' :meth:`~telescope.api.environment.EnvironmentBase.demonstration`
completions (cross-entropy on the completion tokens only), saves the result in
``<run_dir>/warm_start/`` and starts the workers from it. Evaluation "before
training" runs after the warm start, so a before/after comparison measures what
the RL steps added.

Eval items reserved by ``separate_eval_samples`` are excluded here too. The warm
start runs in the driver process on one device with plain torch (it is meant for
small models; large models arrive pre-trained), deterministically for a seed.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

from telescope.config.schema import TelescopeConfig
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.prompts import EnvironmentSlot

log = logging.getLogger("telescope.run.warm_start")


def demonstration_examples(
    slots: list[EnvironmentSlot], renderer: ChatRenderer, limit: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) pairs from the environments' demonstrations."""
    rng = random.Random(seed)
    examples: list[tuple[list[int], list[int]]] = []
    eos = renderer.eos_token_id
    candidates = [(slot, index) for slot in slots for index in slot.usable]
    rng.shuffle(candidates)
    for slot, index in candidates:
        sample = slot.samples[index]
        demo = slot.environment.demonstration(sample)
        if demo is None:
            continue
        completion = renderer.encode(demo) + ([eos] if eos is not None else [])
        examples.append((renderer.prompt_ids(slot.environment.format_prompt(sample)), completion))
        if len(examples) >= limit:
            break
    if not examples:
        names = ", ".join(s.name for s in slots)
        raise ValueError(
            f"warm_start_steps={limit and 'set'} but no environment ({names}) provides demonstrations; "
            "set warm_start_steps: 0"
        )
    return examples


def warm_start(config: TelescopeConfig, slots: list[EnvironmentSlot], output_dir: Path) -> Path:
    """Fine-tune ``config.model`` on demonstrations; save it to ``output_dir``; return the folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    renderer = ChatRenderer(tokenizer, config.chat_template, config.enable_thinking)
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
    model.train()
    batch_size = config.warm_start_batch_size
    examples = demonstration_examples(slots, renderer, batch_size * config.warm_start_steps, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warm_start_learning_rate, weight_decay=0.0)
    rng = random.Random(config.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    loss_value = float("nan")
    for step in range(config.warm_start_steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        input_ids, labels, attention = _collate(batch, pad)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        loss_value = float(loss.detach())
        if step % 20 == 0 or step == config.warm_start_steps - 1:
            log.info("warm start step %d/%d: loss %.4f", step + 1, config.warm_start_steps, loss_value)
    tmp = output_dir.with_name(output_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if output_dir.exists():
        import shutil

        shutil.rmtree(output_dir)
    tmp.rename(output_dir)
    log.info("warm start done (%d steps, final loss %.4f): %s", config.warm_start_steps, loss_value, output_dir)
    return output_dir


def _collate(batch: list[tuple[list[int], list[int]]], pad: int) -> tuple[Any, Any, Any]:
    import torch

    length = max(len(p) + len(c) for p, c in batch)
    input_ids = torch.full((len(batch), length), pad, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), length), dtype=torch.long)
    for row, (prompt, completion) in enumerate(batch):
        ids = prompt + completion
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(prompt) : len(ids)] = torch.tensor(completion)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention
