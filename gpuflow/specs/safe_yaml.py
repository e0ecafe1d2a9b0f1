"""Reading a YAML file a user (or anyone) wrote, in bounded time and memory.

libyaml parses; a Python composer on top of it checks every node before anything is built:
nesting depth, explicit tags (plain data only: no binary, sets, timestamps or objects), keys given
twice, and how many nodes aliases expand to (an alias bomb is a few lines that expand to billions
of nodes in whatever walks the result). The file's size is checked before parsing and its bytes
must be UTF-8. Every problem is a `YamlRefused` naming the line, never a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.cyaml import CParser  # type: ignore[attr-defined]
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from gpuflow.specs.units import shown

MAX_FILE_BYTES = 1024 * 1024
"""Largest file read; a job or fleet file is a few kilobytes, a 10,000-host fleet well under."""
MAX_DEPTH = 32
"""Deepest nesting; real files nest four or five levels."""
MAX_VALUES = 100_000
"""Most values (scalars, lists, mappings) in a file with every alias expanded: bounds the time
to read it (about 10 µs a value) and to check it, whatever its bytes hold. A 2,000-host fleet
file holds about 50,000."""

_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(
    _TAG + name for name in ("str", "int", "float", "bool", "null", "seq", "map", "merge")
)


class YamlRefused(Exception):
    """The file cannot be read as plain YAML data; the message is one line."""


class _Resolver(Resolver):
    """YAML 1.1's implicit types without timestamps: `2024-02-30` stays text for the field's
    own check to refuse, instead of an impossible date failing inside the parser."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TAG + "timestamp"]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        # A plain scalar's type depends on its text alone; files repeat the same few texts
        # (names, sizes, "true"), and matching every resolver's regexp was a third of the time.
        if kind is ScalarNode and implicit[0] and len(value) <= _CACHED_TEXT:
            tag = _RESOLVED.get(value)
            if tag is None:
                tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
                if len(_RESOLVED) < _CACHED_VALUES:
                    _RESOLVED[value] = tag
            return tag
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]


_RESOLVED: dict[str, str] = {}
_CACHED_TEXT = 32
_CACHED_VALUES = 10_000


class _BoundedLoader(Composer, CParser, SafeConstructor, _Resolver):
    """libyaml's events, composed by PyYAML's Composer with checks at every node."""

    def __init__(self, text: str) -> None:
        CParser.__init__(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self._depth = 0
        self._open: set[str] = set()
        """Anchors of the collections being composed: an alias to one is a cycle."""
        self._sizes: dict[int, int] = {}
        """Expanded node counts of the nodes aliases point into, computed when first needed."""
        self._values = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Any = self.peek_event()
        if type(event) is AliasEvent:
            self._count_alias(event)
            return super().compose_node(parent, index)
        self._values += 1
        if self._values > MAX_VALUES:
            raise _refused(
                f"more than {MAX_VALUES} values; split the file", event.start_mark, what="YAML"
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark, what="YAML")
        anchor = event.anchor
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
        self._depth -= 1
        if node is None:
            return None
        if node.tag not in ALLOWED_TAGS:
            tag = "!!" + node.tag.removeprefix(_TAG) if node.tag.startswith(_TAG) else node.tag
            raise _refused(f"tag {shown(tag)} is not allowed; write plain values", node)
        if type(node) is MappingNode:
            _check_keys(node)
        return node

    def _count_alias(self, event: Any) -> None:
        target = self.anchors.get(event.anchor)
        if target is None:
            return  # the Composer reports the undefined alias
        if event.anchor in self._open:
            raise _refused(f"alias *{event.anchor} refers to itself", event.start_mark)
        self._values += self._size(target)
        if self._values > MAX_VALUES:
            raise _refused(
                f"more than {MAX_VALUES} values with aliases expanded",
                event.start_mark,
                what="YAML",
            )

    def _size(self, node: Node) -> int:
        """How many nodes `node` stands for with every alias in it expanded (memoized, so
        each node is walked once however often it is referred to)."""
        size = self._sizes.get(id(node))
        if size is None:
            size = 1
            if type(node) is SequenceNode:
                size += sum(self._size(child) for child in node.value)
            elif type(node) is MappingNode:
                size += sum(self._size(key) + self._size(value) for key, value in node.value)
            self._sizes[id(node)] = size
        return size


def _check_keys(node: MappingNode) -> None:
    keys = [key.value for key, _ in node.value if type(key) is ScalarNode]
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        for key, _ in node.value:
            if type(key) is ScalarNode and key.value in seen:
                raise _refused(f"key {shown(key.value)} is given twice", key)
            seen.add(key.value)


def _checked(construct: Any) -> Any:
    """A scalar constructor whose failure (`!!int abc`, a 5,000-digit number) is a refusal at
    the value's line, and whose integers fit in 64 bits."""

    def checked(loader: SafeConstructor, node: Node) -> Any:
        try:
            value = construct(loader, node)
        except (ValueError, KeyError, OverflowError, ArithmeticError):
            tag = str(node.tag).removeprefix(_TAG)
            raise _refused(f"cannot read {shown(node.value)} as {tag}", node) from None
        if type(value) is int and value.bit_length() > 63:
            raise _refused(f"{shown(value)} is too large for any field", node, what="a number")
        return value

    return checked


for _name in ("int", "float", "bool"):
    _BoundedLoader.add_constructor(
        _TAG + _name, _checked(SafeConstructor.yaml_constructors[_TAG + _name])
    )


def _refused(problem: str, where: Any, *, what: str = "malformed YAML") -> YamlRefused:
    mark = where.start_mark if isinstance(where, Node) else where
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return YamlRefused(f"{what}{at}: {problem}")


Spellings = dict[tuple[Any, ...], tuple[str, Any]]
"""Where YAML read a plain word or number as a bool, an int or a float, by its place in the data
(the keys and list indexes to it, as pydantic's error `loc`; a mapping key's own place ends in
"[key]", as pydantic's does) -> the text as written and the value read. `off` and `no` both read
as False: only the text can tell a user what to quote."""

_TYPED = frozenset(_TAG + name for name in ("bool", "int", "float"))


def _spelled(loader: _BoundedLoader, root: Node, spellings: Spellings) -> None:
    """Fill `spellings` from the composed document (its merge keys already flattened by the
    constructor). Iterative: aliases can nest a document deeper than MAX_DEPTH levels."""
    stack: list[tuple[Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if type(node) is ScalarNode:
            if node.tag in _TYPED:
                spellings[path] = (node.value, loader.construct_object(node))
        elif type(node) is SequenceNode:
            stack.extend((child, (*path, index)) for index, child in enumerate(node.value))
        elif type(node) is MappingNode:
            pairs: dict[Any, Node] = {}  # the last of a key wins, as in the data
            for key_node, value_node in node.value:
                key = key_node.value if key_node.tag == _TAG + "str" else None
                if key is None and type(key_node) is ScalarNode:
                    read = loader.construct_object(key_node)
                    key = read if isinstance(read, int | str) else str(read)  # as in a `loc`
                    if key_node.tag in _TYPED:
                        spellings[(*path, key, "[key]")] = (key_node.value, read)
                pairs[key] = value_node
            stack.extend((child, (*path, key)) for key, child in pairs.items())


def parse_yaml(text: str, *, spellings: Spellings | None = None) -> Any:
    """The one document in `text` as plain data (dicts, lists, str, int, float, bool, None);
    `spellings`, when given, is filled with where YAML read text as a bool or a number."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        data = loader.construct_document(node)
        if spellings is not None:
            _spelled(loader, node, spellings)
        return data
    except YamlRefused:
        raise
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(str(exc.problem or exc.context or "unreadable").split())
        if "nesting depth" in problem:  # PyYAML >= 6.0.4's own limit, met before ours
            problem = f"nested deeper than {MAX_DEPTH} levels"
        elif problem == "but found another document":
            problem = (
                "a second document starts here; the file must hold one document (one job, "
                "fleet, queue or profile): put each in a file of its own"
            )
        raise _refused(problem, exc.problem_mark or exc.context_mark) from None
    except yaml.YAMLError as exc:  # the reader's errors: a control character, say
        raise YamlRefused(f"malformed YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # the depth check makes this unreachable; a last resort
        raise YamlRefused(f"malformed YAML: nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()


def read_text(path: Path) -> str:
    """The file's text: a regular file (or a pipe) of at most MAX_FILE_BYTES, in UTF-8."""
    try:
        if path.is_dir():
            raise YamlRefused("is a directory, not a YAML file")
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise YamlRefused("no such file") from None
    except (OSError, ValueError) as exc:  # a NUL or an over-long name is a ValueError/OSError
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        raise YamlRefused(f"cannot read: {reason}") from None
    if len(data) > MAX_FILE_BYTES:
        raise YamlRefused(f"larger than {MAX_FILE_BYTES // 1024} KiB; not a job or fleet file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlRefused(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def display_path(path: Path | str) -> str:
    """A path as messages show it: printable, on one line, whatever bytes it holds."""
    text = str(path)
    text = re.sub(r"[\x00-\x1f\x7f]", "?", text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
