"""Reading a spec within limits: a file, `--set` values and Airflow Params alike.

A spec arrives from files, the CLI's `--set`, the nightly's `overrides` and the onboarding
form. Whatever arrives is bounded before anything expands it: the file's size, YAML's
nesting depth and aliases (a few hundred bytes of nested aliases expand to billions of
values), and the size of what the aliases expand to. Errors are one line per problem; they
name the file or field and show at most a short excerpt of a value (infra.options.excerpt),
never a file's contents: a file that is not a mapping of spec fields is named, not quoted.
pipelines/spec/__init__.py builds the BenchSpec from what this returns.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.options import EXCERPT_CHARS, excerpt
from training.config import ConfigError

MAX_SPEC_BYTES = 64 * 1024  # the shipped specs are 1-2 KB
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_ALIASES = 64
MAX_VALUES = 20_000  # values of a spec or of its overrides once aliases are expanded
MAX_PROBLEMS = 20  # lines of one error
MAX_LINE = 240

# A field name worth repeating in an error; anything else (a line of some other file) is not shown.
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


class SpecError(ConfigError):
    """The spec is wrong; the message names the field and shows at most an excerpt of the value."""


def field_name(key: object) -> str:
    """A key as an error line shows it: itself when it looks like a field name, else a stand-in."""
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    return key if isinstance(key, str) and _FIELD_NAME.fullmatch(key) else "(a key not shown)"


def one_error(lines: Iterable[str]) -> str:
    """Problem lines as one error: each cut to MAX_LINE characters, at most MAX_PROBLEMS of them."""
    lines = list(dict.fromkeys(line.replace("\n", " ") for line in lines))
    shown = [line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..." for line in lines[:MAX_PROBLEMS]]
    if len(lines) > MAX_PROBLEMS:
        shown.append(f"... and {len(lines) - MAX_PROBLEMS} more problems")
    return "\n".join(shown)


def by_field(lines: Iterable[str], what: str = "configurations") -> list[str]:
    """One line per field that fails: the first line naming it, and how many more `what` fail
    the same way (a spec's `steps` too large fails every configuration of its grid)."""
    fields: dict[str, list[str]] = {}
    for line in dict.fromkeys(lines):
        field = re.sub(r"(\.\d+)+$", "", re.sub(r"grid\[[^\]]*\]\.", "grid[*].", line.split(":", 1)[0]))
        fields.setdefault(field, []).append(line)
    return [same[0] + (f" (and {len(same) - 1} more {what})" if len(same) > 1 else "") for same in fields.values()]


def format_spec_error(err: ValidationError, source: str) -> str:
    """pydantic's errors as `source.field: problem (got excerpt)` lines; an unknown field is named
    only when its name looks like one."""
    lines = []
    for e in err.errors(include_url=False, include_context=False):
        loc = ".".join(field_name(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}.{loc}: not a spec field")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        for whole in (repr(got), str(got)):  # a validator's own message that quotes the value in full
            if len(whole) > EXCERPT_CHARS and whole in msg:
                msg = msg.replace(whole, excerpt(got))
        shown = "" if isinstance(got, dict) or e["type"] == "value_error" else f" (got {excerpt(got)})"
        # A section's own check names its field first ("options.nodes: ..."): one dotted name.
        if e["type"] == "value_error" and (sub := re.match(r"([a-z_][a-z0-9_.]*): ", msg)):
            loc, msg = (f"{loc}.{sub[1]}" if e["loc"] else sub[1]), msg[sub.end():]
        lines.append(f"{source}.{loc}: {msg}{shown}")
    return one_error(by_field(lines, "values"))


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing deep nesting and many aliases while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _Limit(f"uses more than {MAX_ALIASES} aliases")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Limit(f"nests deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Limit(Exception):
    """A YAML document beyond the limits: the message says which."""


def _expanded_values(root: yaml.Node) -> int:
    """How many values the node graph stands for once every alias is expanded (a shared node
    counts once per use), counted without expanding it; _Limit past MAX_VALUES or on a cycle."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise _Limit("holds an alias to itself")
        on_path.add(key)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                raise _Limit(f"expands to more than {MAX_VALUES} values through its aliases")
        on_path.discard(key)
        sizes[key] = total
        return total

    return size(root)


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document within the limits, or SpecError naming `source` (and where in it, never
    what it says there). Each call gets its own copy: callers merge overrides into it."""
    return copy.deepcopy(_parsed(text, source))


# PyYAML's pure-Python composer (the bounded loader needs its hooks) takes tens of milliseconds
# a spec; a process that plans a spec many times (a task's checks, a trigger's form) parses it once.
@functools.lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> Any:
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: {len(text.encode())} bytes, more than the {MAX_SPEC_BYTES} a spec may have")
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_values(node)
        return loader.construct_document(node)
    except _Limit as err:
        raise SpecError(f"{source}: {err}; a spec may not") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{source}: not valid YAML{where}: {(err.problem or 'unreadable')[:EXCERPT_CHARS]}") from None
    except yaml.reader.ReaderError as err:
        raise SpecError(f"{source}: not valid YAML: character #x{err.character:04x} at position {err.position} "
                        "is not allowed") from None
    except (yaml.YAMLError, ValueError, OverflowError) as err:  # e.g. a timestamp out of range
        raise SpecError(f"{source}: not valid YAML: {type(err).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: Path) -> str:
    """A spec file's text, or SpecError naming the file: missing, not a regular file, too big,
    not UTF-8 text."""
    if not path.is_file():  # a directory, a device or a pipe is no spec either
        raise SpecError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise SpecError(f"{path}: cannot be read ({err.strerror})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than the {MAX_SPEC_BYTES} bytes a spec may have")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (a spec is UTF-8 YAML)") from None


def spec_mapping(values: Any, source: str, fields: Iterable[str]) -> dict[str, Any]:
    """`values` as the mapping of spec fields it must be; SpecError naming `source` when it is
    another kind of document (nothing of it shown)."""
    fields = list(fields)
    expected = f"expected a YAML mapping of spec fields ({', '.join(fields[:6])}, ...)"
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise SpecError(f"{source}: not a ddlbench spec: {expected}, got a {type(values).__name__}")
    out = {str(k).replace("-", "_"): v for k, v in values.items()}
    if out and not set(out) & set(fields):
        raise SpecError(f"{source}: not a ddlbench spec: {expected}; it has none of them")
    return out


def load_file(path: Path, fields: Iterable[str]) -> dict[str, Any]:
    """The spec file's mapping of fields, within the limits."""
    return spec_mapping(parse_yaml(read_text(path), str(path)), str(path), fields)


def check_overrides(overrides: dict[str, Any], source: str = "overrides") -> dict[str, Any]:
    """Overrides (Airflow Params, the onboarding form, `--set`) within the same limits as a file
    (nesting, values counted as a shared structure expands); SpecError names the override."""
    seen: dict[int, int] = {}

    def size(value: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise _Limit(f"nests deeper than {MAX_DEPTH} levels")
        if not isinstance(value, dict | list | tuple):
            return 1
        if id(value) in seen:
            return seen[id(value)]
        seen[id(value)] = MAX_VALUES + 1  # a structure that holds itself counts past the limit
        total = 1
        for v in value.values() if isinstance(value, dict) else value:
            total += size(v, depth + 1)
            if total > MAX_VALUES:
                raise _Limit(f"holds more than {MAX_VALUES} values")
        seen[id(value)] = total
        return total

    if not isinstance(overrides, dict):
        raise SpecError(f"{source}: expected a mapping of spec fields, got a {type(overrides).__name__}")
    total = 0
    for key, value in overrides.items():
        try:
            total += size(value, 1)
            if total > MAX_VALUES:
                raise _Limit(f"holds more than {MAX_VALUES} values")
        except _Limit as err:
            raise SpecError(f"{source}.{field_name(key)}: {err}; a spec may not") from None
    return {str(k).replace("-", "_"): v for k, v in overrides.items()}


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge overrides; a dotted key ('regression.throughput_drop') reaches into sections."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        node = out
        *parents, leaf = str(key).split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SpecError(f"overrides.{field_name(key)}: {field_name(p)} is not a section")
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = merge_overrides(node[leaf], value)
        else:
            node[leaf] = value
    return out


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` pairs; VALUE is read as YAML (numbers, lists, booleans) within the limits."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set: expected KEY=VALUE, got {excerpt(item)}")
        out[key.strip()] = parse_yaml(raw, f"--set {field_name(key.strip())}")
    return out
