"""YAML text to Python values in one parse, checked on the way, with the line of every key.

Design. libyaml's parser (the C half of ``yaml.CSafeLoader``) turns the text into
events; the small iterative composer below builds PyYAML node objects from them;
PyYAML's ``SafeConstructor`` then turns that same node tree into Python values. The
text is parsed once. Composing here instead of with ``yaml.compose`` lets every
check run while the tree is built, before any value exists:

- duplicate keys in any mapping, at any depth (YAML says keys are unique; PyYAML
  silently keeps the last value);
- aliases: undefined ones, recursive ones (``&a [*a]``), and an alias bomb ("billion
  laughs"). Every node counts once per place it appears once aliases are expanded;
  that count must not exceed the nodes written plus ``max(ALIAS_ALLOWANCE, nodes
  written)``: aliases may at most double a document, or add 100,000 nodes to a
  small one. The count is computed from subtree sizes, never by expanding;
- nesting deeper than ``MAX_DEPTH`` (libyaml's own composer recurses in C and
  crashes the interpreter at a few ten thousand levels; nothing here recurses);
- more than one document in the file;
- a list with more items than the caller allows at its path (``max_items``: a run's
  ``environments`` and ``evals``); composing stops at the first item too many, so a
  24 MB list of environments is refused in milliseconds instead of being built.

While composing it records, by path (``("environments", 0, "kwargs", "seed")``),
the line of each mapping key and sequence item, and the source text of each plain
scalar that YAML read as something other than a string (``2024-01-01`` as a date,
``on`` as true, ``0123`` as 83), so that messages can name the line and suggest
quoting. Limits: at most ``MAX_LOCATIONS`` paths are recorded (a 24 MB list of
tags would otherwise cost hundreds of MB); past that, a path falls back to its
nearest recorded ancestor (:meth:`SourceMap.line_of`). Paths under non-scalar
mapping keys and inside aliased subtrees are not recorded (their ancestors are).

Without libyaml the pure-Python parser of PyYAML feeds the same composer (about
ten times slower; a warning says so for files over 1 MB). The cyclic garbage
collector is paused while the tree and the values are built: millions of new
objects, none of them garbage, would otherwise trigger many useless full collections.
"""

from __future__ import annotations

import datetime
import gc
import sys
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from telescope.config.errors import ConfigError

Loc = tuple[str | int, ...]

MAX_DEPTH = 100
ALIAS_ALLOWANCE = 100_000
MAX_LOCATIONS = 100_000
SLOW_PARSER_WARNING_BYTES = 1_000_000

STR_TAG = "tag:yaml.org,2002:str"
SEQ_TAG = "tag:yaml.org,2002:seq"
MAP_TAG = "tag:yaml.org,2002:map"
MERGE_TAG = "tag:yaml.org,2002:merge"

#: libyaml's event parser when PyYAML was built with it, else the pure-Python one.
PARSER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SlowYamlWarning(UserWarning):
    """PyYAML has no libyaml: large configs are read by the pure-Python parser."""


def format_path(loc: Loc) -> str:
    """``("environments", 0, "kwargs")`` -> ``environments[0].kwargs``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def mark_text(name: str, mark: Any) -> str:
    """``file:line:column`` (1-based) of a PyYAML mark."""
    return f"{name}:{mark.line + 1}:{mark.column + 1}"


@dataclass
class SourceMap:
    """Where values of a YAML file were written: line by path, and plain-scalar text.

    ``lines`` maps a path (``("environments", 0, "kwargs", "seed")``; keys as
    written, list indices as ints) to the 1-based line of that key or item;
    ``plain`` maps a path to the source text of a plain scalar YAML read as a
    non-string (bool, number, date, null). Both are capped (see the module doc).
    """

    name: str
    lines: dict[Loc, int] = field(default_factory=dict)
    plain: dict[Loc, str] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> tuple[int, bool] | None:
        """(line, exact) of ``loc`` or of its nearest recorded ancestor; None if none is."""
        for end in range(len(loc), 0, -1):
            key = tuple(loc[:end])
            line = self.lines.get(key) if all(isinstance(p, (str, int)) for p in key) else None
            if line is not None:
                return line, end == len(loc)
        return None

    def where(self, loc: Loc) -> str | None:
        """``file:line`` of ``loc`` (or of its nearest recorded ancestor)."""
        found = self.line_of(loc)
        return f"{self.name}:{found[0]}" if found else None


class _Frame:
    """A collection being composed."""

    __slots__ = ("anchor", "index", "items", "key", "keys", "limit", "node", "path", "seq", "size")

    def __init__(self, node: Node, path: Loc | None, anchor: str | None, limit: int = sys.maxsize) -> None:
        self.node = node
        self.items: list[Any] = node.value
        self.seq = isinstance(node, SequenceNode)
        self.path = path  # None: not recorded (under a non-scalar key)
        self.anchor = anchor
        self.size = 1  # nodes once aliases are expanded, this one included
        self.index = 0  # sequences: index of the next item
        self.limit = limit  # sequences: the most items allowed (see load_yaml's max_items)
        self.key: Node | None = None  # mappings: the key awaiting its value
        self.keys: dict[tuple[str, str], int] = {}  # mappings: scalar key -> line


def _plain_resolvers() -> tuple[dict[str, list[tuple[str, Any]]], list[tuple[str, Any]]]:
    """PyYAML's implicit-type resolvers by first character, as ``Resolver.resolve`` uses them."""
    table = Resolver.yaml_implicit_resolvers
    wildcard = list(table.get(None, []))
    return {ch: list(rs) + wildcard for ch, rs in table.items() if ch is not None}, wildcard


_BY_FIRST_CHAR, _WILDCARD = _plain_resolvers()


def _resolve_plain(value: str) -> str:
    """The tag of an untagged plain scalar (the fast path of ``Resolver.resolve``)."""
    for tag, regexp in _BY_FIRST_CHAR.get(value[:1], _WILDCARD):
        if regexp.match(value):
            return str(tag)
    return STR_TAG


class _Composer:
    """Builds one document's node tree from parser events, checking as it goes.

    Scalars (nearly all events in a large file) take an inlined path in
    :meth:`compose`; the rest go through the methods below.
    """

    def __init__(self, name: str, prefix: Loc, max_items: Mapping[Loc, int] | None = None) -> None:
        self.name = name
        self.prefix = prefix
        self.max_items = dict(max_items or {})
        self.resolver = Resolver()
        self.source = SourceMap(name)
        self.recorded = 0
        self.anchors: dict[str, tuple[Node, int]] = {}  # name -> (node, expanded size)
        self.open_anchors: set[str] = set()
        self.stack: list[_Frame] = []
        self.root: Node | None = None
        self.root_size = 0
        self.written = 0
        self.largest_alias: tuple[int, str, int] = (0, "", 0)  # (size, name, line)
        self.problems: list[str] = []

    # ---------------------------------------------------------------- events

    def compose(self, text: str) -> Node | None:
        parser = PARSER(text)
        get_event = parser.get_event
        stack = self.stack
        frame: _Frame | None = None
        documents = 0
        try:
            while (event := get_event()) is not None:
                cls = type(event)
                if cls is not ScalarEvent:
                    if cls is SequenceStartEvent or cls is MappingStartEvent:
                        self._start(event)
                    elif cls is SequenceEndEvent or cls is MappingEndEvent:
                        self._end()
                    elif cls is AliasEvent:
                        self._alias(event)
                    elif cls is DocumentStartEvent:
                        documents += 1
                        if documents > 1:
                            self._fail(
                                f"{mark_text(self.name, event.start_mark)}: a second YAML document starts here "
                                "(after `---`); a config is one document: remove the `---` line or split the file"
                            )
                    elif cls is StreamEndEvent:
                        break
                    frame = stack[-1] if stack else None
                    continue
                # ---- a scalar
                value = event.value
                tag = event.tag
                plain = event.implicit[0]
                if tag is None:
                    tag = _resolve_plain(value) if plain else STR_TAG
                elif tag == "!":
                    tag = self.resolver.resolve(ScalarNode, value, event.implicit)
                mark = event.start_mark
                node = ScalarNode(tag, value, mark, mark, event.style)
                self.written += 1
                if event.anchor is not None:
                    self._register(event.anchor, event)
                    self.anchors[event.anchor] = (node, 1)
                if frame is None:
                    self.root, self.root_size = node, 1
                    continue
                frame.size += 1
                if frame.seq:
                    if frame.index >= frame.limit:
                        self._too_many(frame, mark)
                    if frame.path is not None and self.recorded < MAX_LOCATIONS:
                        path = self._place(frame, mark.line + 1)
                        if path is not None and tag != STR_TAG and plain:
                            self.source.plain[path] = value
                    frame.index += 1
                    frame.items.append(node)
                elif frame.key is None:
                    frame.key = node
                    self._check_key(frame, node, mark.line + 1)
                else:
                    if tag != STR_TAG and plain and self.recorded < MAX_LOCATIONS:
                        path = self._place(frame, 0)
                        if path is not None:
                            self.source.plain[path] = value
                            self.recorded += 1
                    frame.items.append((frame.key, node))
                    frame.key = None
        finally:
            parser.dispose()
        self._check_aliases()
        if self.problems:
            raise ConfigError(self.problems)
        return self.root

    def _fail(self, message: str) -> None:
        raise ConfigError([*self.problems, message])

    def _too_many(self, frame: _Frame, mark: Any) -> None:
        """Stop at the first item past the limit of its list: the rest is neither read nor built."""
        self._fail(
            f"{mark_text(self.name, mark)}: {format_path(frame.path or ())} has more than {frame.limit:,} entries; "
            f"at most {frame.limit:,} are allowed (each entry builds its own environment at run time: list each "
            "environment once, its weight and kwargs set how it is used)"
        )

    def _register(self, anchor: str, event: Any) -> None:
        if anchor in self.anchors or anchor in self.open_anchors:
            self._fail(
                f"{mark_text(self.name, event.start_mark)}: the anchor &{anchor} is defined twice; "
                "give each anchor its own name"
            )

    def _start(self, event: Any) -> None:
        if len(self.stack) >= MAX_DEPTH:
            self._fail(
                f"{mark_text(self.name, event.start_mark)}: nesting deeper than {MAX_DEPTH} levels; "
                "a config never needs this (check for runaway brackets or indentation)"
            )
        node_cls = SequenceNode if isinstance(event, SequenceStartEvent) else MappingNode
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(node_cls, None, event.implicit)
        node = node_cls(tag, [], event.start_mark, event.start_mark, event.flow_style)
        self.written += 1
        if event.anchor is not None:
            self._register(event.anchor, event)
            self.open_anchors.add(event.anchor)
        if not self.stack:
            path: Loc | None = self.prefix
        elif self.stack[-1].key is None and not self.stack[-1].seq:
            path = None  # a collection as a mapping key: nothing under it is recorded
        else:
            path = self._place(self.stack[-1], event.start_mark.line + 1)
        limit = self.max_items.get(path, sys.maxsize) if path is not None else sys.maxsize
        self.stack.append(_Frame(node, path, event.anchor, limit))

    def _end(self) -> None:
        frame = self.stack.pop()
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = (frame.node, frame.size)
        self._attach(frame.node, frame.size)

    def _alias(self, event: AliasEvent) -> None:
        anchor, mark = str(event.anchor), event.start_mark
        where = mark_text(self.name, mark)
        if anchor in self.open_anchors:
            self._fail(
                f"{where}: the alias *{anchor} refers to a collection that contains it; a config cannot be recursive"
            )
        if anchor not in self.anchors:
            self._fail(f"{where}: the alias *{anchor} has no anchor &{anchor} before it")
        node, size = self.anchors[anchor]
        line = mark.line + 1 if mark is not None else 0
        if size > self.largest_alias[0]:
            self.largest_alias = (size, anchor, line)
        if self.stack:
            parent = self.stack[-1]
            if not parent.seq and parent.key is None:
                if isinstance(node, ScalarNode):
                    self._check_key(parent, node, line)
            else:
                self._place(parent, line)
        self._attach(node, size)

    # ------------------------------------------------------------- structure

    def _place(self, parent: _Frame, line: int) -> Loc | None:
        """Path of the value about to be added to ``parent`` (recording a sequence item's line).

        None when it is not recorded: under a non-scalar key, or past the cap.
        """
        if parent.path is None:
            return None
        if parent.seq:
            path: Loc = (*parent.path, parent.index)
            if self.recorded < MAX_LOCATIONS:
                self.source.lines[path] = line
                self.recorded += 1
            return path
        if isinstance(parent.key, ScalarNode):
            return (*parent.path, parent.key.value)  # its line is the key's, recorded already
        return None

    def _attach(self, node: Node, size: int) -> None:
        """Add a finished collection or an alias to its parent (or make it the document)."""
        if not self.stack:
            self.root, self.root_size = node, size
            return
        parent = self.stack[-1]
        parent.size += size
        if parent.seq:
            if parent.index >= parent.limit:
                self._too_many(parent, node.start_mark)
            parent.index += 1
            parent.items.append(node)
        elif parent.key is None:
            parent.key = node
        else:
            parent.items.append((parent.key, node))
            parent.key = None

    def _check_key(self, parent: _Frame, key: ScalarNode, line: int) -> None:
        """Record a mapping key's line, or report it as a duplicate."""
        if key.tag == MERGE_TAG:  # `<<: *base` may repeat; later keys override merged ones
            return
        seen = parent.keys.get((key.tag, key.value))
        if seen is not None:
            if parent.path is None:
                scope = "in a mapping"
            else:
                scope = f"in {format_path(parent.path)}" if parent.path else "at the top level"
            both = f"{self.name}:{line} (twice)" if seen == line else f"{self.name}:{seen} and {self.name}:{line}"
            self.problems.append(
                f"duplicate key {key.value!r} {scope} at {both}: YAML would keep only the "
                "last value and silently drop the other; remove or merge one of them"
            )
            return
        parent.keys[(key.tag, key.value)] = line
        top_level = len(self.stack) == 1  # always recorded: few, and they name provenance
        if parent.path is not None and (self.recorded < MAX_LOCATIONS or top_level):
            self.source.lines[(*parent.path, key.value)] = line
            self.recorded += 1

    def _check_aliases(self) -> None:
        expanded, written = self.root_size, self.written
        limit = written + max(ALIAS_ALLOWANCE, written)
        if expanded > limit:
            size, anchor, line = self.largest_alias
            self._fail(
                f"{self.name}: its aliases expand to {expanded:,} nodes from the {written:,} written "
                f"(e.g. *{anchor} at {self.name}:{line} stands for {size:,}); at most {limit:,} are allowed "
                f"(aliases may add up to max({ALIAS_ALLOWANCE:,}, the nodes written)). This looks like an "
                "alias bomb; write the values out or use fewer nested aliases"
            )


_IMPLICIT_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (datetime.datetime, "a timestamp"),
    (datetime.date, "a date"),
    (int, "a number"),
    (float, "a number"),
)


def quote_hint(loc: Loc, value: Any, source: SourceMap | None) -> str | None:
    """Advice for a text field given a value YAML read as a date, boolean, number or null.

    ``YAML reads 2024-01-01 as a date, but wandb_run_name takes text; quote it:
    wandb_run_name: "2024-01-01"``. Uses the text as written when ``source``
    recorded it (``on``, ``0123``), else the value's usual spelling. None if the
    value is of another type (a list, say), where quoting would not help.
    """
    text = source.plain.get(loc) if source is not None else None
    if value is None:
        what = "null"
        text = "null" if text is None else text
    else:
        what = next((name for cls, name in _IMPLICIT_KINDS if isinstance(value, cls)), "")
        if not what:
            return None
        if text is None:
            text = value.isoformat() if isinstance(value, datetime.date) else str(value).lower()
    name = format_path(loc) or "this field"
    written = f"{loc[-1]}: " if loc and isinstance(loc[-1], str) else "- "
    if not text:
        return f"{name} has no value (YAML reads an empty value as null); write it after the colon: {written}..."
    return f'YAML reads {text} as {what}, but {name} takes text; quote it: {written}"{text}"'


# ---------------------------------------------------------------- entry point


def _yaml_error(name: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = mark_text(name, mark) if mark is not None else name
    problem = getattr(exc, "problem", None) or str(exc)
    if "exceeded maximum nesting depth" in problem:  # PyYAML >= 6.0.3 scans ahead and stops first
        return (
            f"{where}: nesting deeper than {MAX_DEPTH} levels; "
            "a config never needs this (check for runaway brackets or indentation)"
        )
    context = getattr(exc, "context", None)
    detail = f"{context}, {problem}" if context else problem
    return f"invalid YAML at {where}: {detail}"


def _bad_scalar(name: str, root: Node, exc: Exception) -> str:
    """Find the scalar whose construction failed (a rare path: walks the tree again)."""
    constructor = SafeConstructor()
    todo: list[Node] = [root]
    seen: set[int] = set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ScalarNode):
            if node.tag == STR_TAG:
                continue
            try:
                constructor.construct_object(node, deep=True)
            except (ValueError, TypeError, OverflowError) as err:
                where = mark_text(name, node.start_mark)
                kind = node.tag.rsplit(":", 1)[-1]
                return (
                    f"{where}: {node.value!r} is read by YAML as a {kind} but is not a valid one ({err}); "
                    f'if it is text, quote it: "{node.value}"'
                )
        elif isinstance(node, SequenceNode):
            todo.extend(reversed(node.value))
        elif isinstance(node, MappingNode):
            for key, value in reversed(node.value):
                todo.extend((value, key))
    return f"{name}: a value could not be read ({exc})"


def _build(node: Node, constructor: SafeConstructor, shared: dict[int, Any]) -> Any:
    """Python values of a node tree; the same values ``SafeConstructor`` gives, faster.

    Plain strings, lists and mappings (nearly everything in a config) are built
    here; every other node (numbers, dates, merge keys ``<<``, explicit tags) goes
    to PyYAML's ``constructor``. A collection reached twice (through an alias) is
    built once and shared, as PyYAML does. Recursion is bounded by ``MAX_DEPTH``.
    """
    cls = node.__class__
    if cls is ScalarNode:
        return node.value if node.tag == STR_TAG else constructor.construct_object(node, deep=True)
    built = shared.get(id(node))
    if built is not None:
        return built
    if cls is SequenceNode and node.tag == SEQ_TAG:
        out: Any = []
        shared[id(node)] = out
        out.extend(
            item.value if item.__class__ is ScalarNode and item.tag == STR_TAG else _build(item, constructor, shared)
            for item in node.value
        )
        return out
    if cls is MappingNode and node.tag == MAP_TAG and not any(k.tag == MERGE_TAG for k, _ in node.value):
        out = {}
        shared[id(node)] = out
        for key_node, value_node in node.value:
            key = _build(key_node, constructor, shared)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                )
            out[key] = (
                value_node.value
                if value_node.__class__ is ScalarNode and value_node.tag == STR_TAG
                else _build(value_node, constructor, shared)
            )
        return out
    out = constructor.construct_object(node, deep=True)
    shared[id(node)] = out
    return out


def load_yaml(
    text: str, name: str, prefix: Loc = (), max_items: Mapping[Loc, int] | None = None
) -> tuple[Any, SourceMap]:
    """Parse one YAML document; returns (value, where things were written).

    Raises :class:`ConfigError` for invalid YAML (file, line, column), duplicate
    keys, alias bombs, recursive or undefined aliases, excessive nesting, several
    documents, and values YAML cannot build (``2024-13-45`` as a date). An empty
    document gives ``None``. ``name`` names the text in messages (``name:line:col``);
    ``prefix`` starts every recorded path (a CLI value ``--environments`` is read
    with the prefix ``("environments",)``). ``max_items``: the most items the list at a
    path may hold (``{("environments",): 1000}``); parsing stops at the first item past
    it, so that a huge list is refused in the time it takes to read the allowed part.
    """
    if PARSER is yaml.SafeLoader and len(text) > SLOW_PARSER_WARNING_BYTES:
        warnings.warn(
            f"PyYAML has no libyaml here: reading {name} ({len(text) / 1e6:.0f} MB) with the slow "
            "pure-Python parser; install a PyYAML wheel built with libyaml",
            SlowYamlWarning,
            stacklevel=3,
        )
    composer = _Composer(name, prefix, max_items)
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            root = composer.compose(text)
        except yaml.YAMLError as exc:
            raise ConfigError([*composer.problems, _yaml_error(name, exc)]) from None
        if root is None:
            return None, composer.source
        try:
            data = _build(root, SafeConstructor(), {})
        except yaml.YAMLError as exc:
            raise ConfigError([_yaml_error(name, exc)]) from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConfigError([_bad_scalar(name, root, exc)]) from None
    finally:
        if collecting:
            gc.enable()
    return data, composer.source
