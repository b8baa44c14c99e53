"""Scripted solutions of MiniWoB++ tasks, read from the prompt as a model reads it.

:func:`scripted_reply` takes the prompt ``miniwob`` shows (``Task: <instruction>\\nPage:\\n<snapshot>``)
and returns the reply a good policy gives: the tool calls in the model's markup
(``<tool_call>{"name": "click", "arguments": {"ref": 3}}</tool_call>``), or None for a task
it has no script for. The warm start fine-tunes on these replies (``demonstration_turns``,
``demonstration_replies``), and the tests play them.

Scripts: click-button, click-link, click-checkboxes, enter-text (the default tasks). Each
finds its control by the label the snapshot gives it, so a script fails (None) rather than
guesses when the page is not what it expects.
"""

from __future__ import annotations

import json
import re


def call(name: str, **arguments: object) -> str:
    """One tool call in the model's markup (compact JSON: fewer tokens for a small model to get right)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments}, separators=(',', ':'))}</tool_call>"


def ref_of(page: str, pattern: str) -> int | None:
    """The number of the first control line of ``page`` matching ``pattern`` (a regex), or None."""
    for line in page.splitlines():
        if line.startswith("[") and re.search(pattern, line):
            return int(line[1 : line.index("]")])
    return None


def scripted_reply(prompt: str) -> str | None:
    """The tool calls that solve the task of ``prompt``, or None (no script, or the page is not as expected)."""
    if "\nPage:\n" not in prompt:
        return None
    task, page = prompt.split("\nPage:\n", 1)
    calls: list[tuple[str, dict[str, object]]]
    if m := re.search(r'Click on the "(.+?)" button', task):
        refs = [ref_of(page, rf'button "{re.escape(m.group(1))}"')]
        calls = [("click", {"ref": refs[0]})]
    elif m := re.search(r'Click on the link "(.+?)"', task):
        refs = [ref_of(page, rf'^\[\d+\] (a|clickable) "{re.escape(m.group(1))}"')]
        calls = [("click", {"ref": refs[0]})]
    elif m := re.search(r"Select (.*?) and click Submit", task):
        wanted = [w.strip() for w in m.group(1).split(",") if w.strip() and w.strip() != "nothing"]
        refs = [ref_of(page, rf'checkbox "{re.escape(w)}"') for w in wanted] + [ref_of(page, 'button "Submit"')]
        calls = [("click", {"ref": ref}) for ref in refs]
    elif m := re.search(r'Enter "(.+?)" into the text field', task):
        refs = [ref_of(page, r"\] text "), ref_of(page, 'button "Submit"')]
        calls = [("type_text", {"ref": refs[0], "text": m.group(1)}), ("click", {"ref": refs[1]})]
    else:
        return None
    if any(ref is None for ref in refs):
        return None
    return "".join(call(name, **arguments) for name, arguments in calls)
