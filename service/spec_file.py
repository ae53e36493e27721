"""Reading an experiment spec from a JSON or YAML file, strictly: what comes out is JSON, as the
API will receive it, or the file is refused with one line naming it and, where it can, the line.

YAML says more than JSON, and the command line would send whatever it built: an alias bomb
("billion laughs": nine lines whose aliases repeat nodes, gigabytes once written out as JSON),
a recursive alias (a list that holds itself), tags JSON has no type for (`!!binary` bytes,
timestamps, `!!set`, `!!python/...`), NaN and infinity, keys that are not strings, a key twice in
one mapping (YAML keeps the last, silently), integers of hundreds of digits. Composing a
YAML document builds its node graph with each aliased node once, so every check here runs on
that graph, before anything is built, and counts an aliased node as often as it is repeated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
# The most a spec may expand to, in characters of JSON (about: each scalar with two more for
# quotes or a separator, two per list or mapping): 16 times the service's default request limit
# (SEEDGRID_MAX_REQUEST_BODY_BYTES), so that no spec a service takes is refused here.
MAX_SPEC_CHARS = 16 * 2**20
# A spec file larger than this is refused by its size, before it is read (a 20 MB YAML file
# took 20 s to be refused once parsed): as large as the most a spec may expand to.
MAX_SPEC_FILE_BYTES = MAX_SPEC_CHARS
# Integers longer than this are refused: no config field takes one (a float's largest is 309
# digits), and Python refuses to convert one of more than 4,300 (a traceback, once).
MAX_INT_DIGITS = 400

YAML_TAG = "tag:yaml.org,2002:"
# The YAML types JSON has; `<<` merge keys are allowed too (they copy mappings, as aliases do).
JSON_SCALAR_TAGS = frozenset(YAML_TAG + t for t in ("null", "bool", "int", "float", "str"))
STR_TAG, FLOAT_TAG, MERGE_TAG = YAML_TAG + "str", YAML_TAG + "float", YAML_TAG + "merge"
SEQ_TAG, MAP_TAG, TIMESTAMP_TAG = YAML_TAG + "seq", YAML_TAG + "map", YAML_TAG + "timestamp"
INT_TAG = YAML_TAG + "int"


class SpecFileError(ValueError):
    """The file cannot be a spec; the message is one line naming it."""


def load_spec_file(path: Path) -> dict[str, Any]:
    """The spec in a .json, .yaml or .yml file, as JSON values. Raises SpecFileError naming
    the file (and, for any other file, the types expected: a README passed by mistake is not
    "invalid YAML")."""
    suffix = path.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise SpecFileError(f"expected a .json, .yaml or .yml spec file, got {path.name}")
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_FILE_BYTES:
            raise SpecFileError(
                f"spec file {path} is {size:,} bytes: a spec file may be at most "
                f"{MAX_SPEC_FILE_BYTES:,}"
            )
        text = path.read_text()
    except OSError as exc:
        raise SpecFileError(f"cannot read spec file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"spec file {path} is not UTF-8 text: {exc.reason}") from None
    try:
        spec = _json(text, path) if suffix == ".json" else _yaml(text, path)
    except RecursionError:
        raise SpecFileError(f"spec file {path} is nested too deeply") from None
    if not isinstance(spec, dict):
        raise SpecFileError(
            f"spec file {path} must hold a mapping (name, trainer, config, grid, seeds)"
        )
    return spec


def _json(text: str, path: Path) -> Any:
    def no_constant(name: str) -> Any:
        raise SpecFileError(f"spec file {path}: {name} is not a JSON number")

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise SpecFileError(f"spec file {path}: {_too_long(digits)}")
        return int(digits)

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        mapping: dict[str, Any] = {}
        for key, value in pairs:
            if key in mapping:
                raise SpecFileError(f"spec file {path}: {_twice(key)}")
            mapping[key] = value
        return mapping

    try:
        return json.loads(
            text, parse_constant=no_constant, parse_int=integer, object_pairs_hook=unique_keys
        )
    except json.JSONDecodeError as exc:
        raise SpecFileError(f"spec file {path} is not valid JSON: {exc}") from None


def _too_long(digits: str) -> str:
    shown = f"{digits[:12]}..." if len(digits) > 15 else digits
    return (
        f"the integer {shown} has {len(digits.lstrip('-')):,} digits: at most "
        f"{MAX_INT_DIGITS} are read"
    )


def _twice(key: str) -> str:
    return f"the key {key!r} appears twice in one mapping (which one did you mean?)"


def _yaml(text: str, path: Path) -> Any:
    try:
        # the reader checks the text as it is built: a control character is refused here
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise SpecFileError(
            f"spec file {path} is not valid YAML: character #x{exc.character:04x} is not "
            f"allowed (line {line})"
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:  # an empty file
            return None
        check_json_graph(node, loader, path)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecFileError(
            f"spec file {path} is not valid YAML: {exc.problem or exc.context}{where}"
        ) from None
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()
        raise SpecFileError(
            f"spec file {path} is not valid YAML: {first[0] if first else type(exc).__name__}"
        ) from None
    finally:
        loader.dispose()


def check_json_graph(root: Node, loader: yaml.SafeLoader, path: Path) -> None:
    """Refuse, naming the file and the line, a node graph that is not JSON or that expands to
    more than MAX_SPEC_CHARS: each node is visited once (depth first, without recursion), its
    expanded size the sum of its children's, so a repeated alias costs nothing to measure."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the ancestors of the node being visited
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size = 2 + sum(sizes[id(child)] + 1 for child in _children(node))
            if size > MAX_SPEC_CHARS:
                raise SpecFileError(
                    f"{_where(path, node)}: expands to more than "
                    f"{MAX_SPEC_CHARS:,} characters (aliases repeating aliases?)"
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise SpecFileError(
                f"{_where(path, node)}: a recursive alias (a node that contains "
                "itself) has no JSON form"
            )
        if isinstance(node, ScalarNode):
            _check_scalar(node, loader, path)
            sizes[key] = len(node.value) + 2
            continue
        _check_collection(node, path)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, SequenceNode) else []


def _where(path: Path, node: Node) -> str:
    return f"spec file {path}: line {node.start_mark.line + 1}"


def _shown(tag: str) -> str:
    return tag.replace(YAML_TAG, "!!", 1)


def _check_scalar(node: ScalarNode, loader: yaml.SafeLoader, path: Path) -> None:
    if node.tag == TIMESTAMP_TAG:
        raise SpecFileError(
            f"{_where(path, node)}: {node.value} is a YAML timestamp, which JSON "
            "has no type for: quote it to keep it as text"
        )
    if node.tag not in JSON_SCALAR_TAGS and node.tag != MERGE_TAG:
        raise SpecFileError(
            f"{_where(path, node)}: the tag {_shown(node.tag)} has no JSON type "
            "(a spec holds mappings, lists, strings, numbers, true, false, null)"
        )
    if node.tag == INT_TAG and len(node.value.lstrip("+-")) > MAX_INT_DIGITS:
        raise SpecFileError(f"{_where(path, node)}: {_too_long(node.value)}")
    if node.tag == FLOAT_TAG and not math.isfinite(loader.construct_yaml_float(node)):
        raise SpecFileError(
            f"{_where(path, node)}: {node.value} is not a JSON number (JSON has no NaN or infinity)"
        )


def _check_collection(node: Node, path: Path) -> None:
    expected = MAP_TAG if isinstance(node, MappingNode) else SEQ_TAG
    if node.tag != expected:
        raise SpecFileError(
            f"{_where(path, node)}: the tag {_shown(node.tag)} has no JSON type "
            "(a spec holds mappings, lists, strings, numbers, true, false, null)"
        )
    if isinstance(node, MappingNode):
        seen: set[str] = set()
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag not in (STR_TAG, MERGE_TAG):
                shown = key.value if isinstance(key, ScalarNode) else "a list or mapping"
                raise SpecFileError(
                    f"{_where(path, key)}: the key {shown} is not a string (JSON "
                    "keys are strings): quote it"
                )
            if key.tag == STR_TAG:
                if key.value in seen:  # YAML would keep the last one, silently
                    raise SpecFileError(f"{_where(path, key)}: {_twice(key.value)}")
                seen.add(key.value)
