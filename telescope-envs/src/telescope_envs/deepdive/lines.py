"""Reading a page by lines: what ``scan_page`` and ``open_lines`` show the model.

A page is plain text; its lines are numbered from 0. ``scan_page`` reports the
page's size and, given a regular expression, the matching lines (``L<n>: text``)
with optional context blocks around them; ``open_lines`` renders chosen line
ranges. The output format is the upstream deepdive's (``build_explore_block``,
``render_line_ranges``), so prompts and trained models carry over.

Pure functions of strings: no I/O, no state.
"""

from __future__ import annotations

import re
from typing import Any

TRUNCATED = "\n...\n[truncated]"


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a visible sentinel when cut."""
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED


def normalize_line_ranges(lines: Any) -> list[tuple[int, int]]:
    """``[start, end]`` or ``[[start, end], ...]`` as sorted, merged, non-negative inclusive ranges.

    Reversed ranges are swapped, negative starts clamped to 0, ranges entirely below 0
    and malformed items dropped (the model sees what it can get, not an exception).
    """
    if not isinstance(lines, list | tuple):
        return []
    if len(lines) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in lines):
        lines = [list(lines)]
    ranges: list[tuple[int, int]] = []
    for item in lines:
        if not isinstance(item, list | tuple) or len(item) != 2:
            continue
        start, end = item
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            continue
        if start > end:
            start, end = end, start
        if end < 0:
            continue
        ranges.append((max(start, 0), end))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def render_line_ranges(content: str, ranges: list[tuple[int, int]]) -> str:
    """The text of each inclusive range, labelled ``L<start>..<end>:``, in a ``txt`` fence."""
    lines = content.splitlines()
    blocks: list[str] = []
    for start, end in ranges:
        last = min(end, len(lines) - 1)
        if start > last:
            blocks.append(f"L{start}..{end}: ")
            continue
        chunk = "\n".join(lines[start : last + 1])
        blocks.append(f"L{start}..{end}:\n\n```txt\n{chunk}\n```")
    return "\n\n".join(blocks)


def compile_pattern(pattern: str | None) -> tuple[re.Pattern[str] | None, str | None]:
    """A case-insensitive regex, or (None, the compile error)."""
    if not pattern:
        return None, None
    try:
        return re.compile(pattern, re.IGNORECASE), None
    except re.error as exc:
        return None, str(exc)


def scan_block(
    url: str,
    content: str | None,
    error: str | None,
    page_format: str,
    pattern_text: str | None,
    context_lines: int = 0,
    max_matches: int = 200,
) -> str:
    """The ``scan_page`` report: size, error, and the lines matching ``pattern_text``."""
    text = content or ""
    lines = text.splitlines()
    out = [
        "# Explore Result 0",
        f"source: {url}",
        f"char_count: {len(text)}",
        f"line_count: {len(lines)}",
        f"content_is_none: {content is None}",
        f"error: {error if error is not None else 'None'}",
        f"format: {page_format}",
    ]
    if pattern_text is None:
        return "\n".join(out)
    pattern, pattern_error = compile_pattern(pattern_text)
    context_lines, max_matches = max(0, int(context_lines)), max(0, int(max_matches))
    out += [f"pattern: {pattern_text} (case-insensitive)", f"context_lines: {context_lines}"]
    out.append(f"max_matches: {max_matches}")
    if pattern_error:
        out.append(f"pattern_error: {pattern_error}")
        return "\n".join(out)
    if content is None or error is not None or pattern is None:
        out.append("matches: (unavailable)")
        return "\n".join(out)
    matches = [(i, line) for i, line in enumerate(lines) if pattern.search(line)]
    truncated = len(matches) > max_matches
    matches = matches[:max_matches]
    if not matches:
        out.append("matches: (none)")
    else:
        out.append("matches:")
        out += [f"L{i}: {line}" for i, line in matches]
    if truncated:
        out.append("matches_truncated: true")
    if matches and context_lines > 0:
        windows = [[max(i - context_lines, 0), min(i + context_lines, len(lines) - 1)] for i, _ in matches]
        out += ["context_blocks:", render_line_ranges(text, normalize_line_ranges(windows))]
    return "\n".join(out)
