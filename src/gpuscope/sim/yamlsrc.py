"""Typed access to a composed YAML tree that remembers where every value came from.

Scenario files are written by hand, so every complaint must point at the file, the line and the
field (``bad.yaml:12: faults[3].target.gpu: ...``). ``yaml.safe_load`` throws the marks away;
``yaml.compose`` keeps them, and :class:`Src` wraps one composed node with its field path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NoReturn

import yaml

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_STR = "tag:yaml.org,2002:str"


class ScenarioError(ValueError):
    """A scenario was refused; the message names the file, the line and the field."""

    def __init__(self, file: str, line: int | None, field: str, message: str) -> None:
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")
        self.file = file
        self.line = line
        self.field = field
        self.message = message


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}"


def compose(text: str, file: str) -> yaml.Node | None:
    """Compose one YAML document, turning syntax errors into :class:`ScenarioError`."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ScenarioError(file, line, "", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(file, None, "", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise ScenarioError(file, None, "", "not valid YAML: nested too deeply") from None


class Src:
    """One YAML node, its field path (``jobs[1].nodes``) and the file it came from."""

    __slots__ = ("file", "node", "path")

    def __init__(self, node: yaml.Node, path: str, file: str) -> None:
        self.node = node
        self.path = path
        self.file = file

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def fail(self, message: str, field: str | None = None) -> NoReturn:
        raise ScenarioError(self.file, self.line, self.path if field is None else field, message)

    def child(self, node: yaml.Node, suffix: str) -> Src:
        sep = "" if suffix.startswith("[") or not self.path else "."
        return Src(node, f"{self.path}{sep}{suffix}", self.file)

    # -- containers -------------------------------------------------------------------------------

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag == _NULL

    def mapping(self, allowed: frozenset[str] | set[str], required: tuple[str, ...] = ()) -> dict[str, Src]:
        """The entries of a mapping; unknown, duplicate or missing keys are errors."""
        if not isinstance(self.node, yaml.MappingNode):
            self.fail(f"must be a mapping, got {_describe(self.node)}")
        out: dict[str, Src] = {}
        for key_node, value_node in self.node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                Src(key_node, self.path, self.file).fail(f"keys must be names, got {_describe(key_node)}")
            key = str(key_node.value)
            key_src = self.child(key_node, key)
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                key_src.fail(f"unknown field (known: {known})")
            if key in out:
                key_src.fail("appears twice")
            out[key] = self.child(value_node, key)
        for key in required:
            if key not in out:
                self.fail(f"missing required field {key!r}")
        return out

    def items(self) -> Iterator[Src]:
        """The items of a list."""
        if not isinstance(self.node, yaml.SequenceNode):
            self.fail(f"must be a list, got {_describe(self.node)}")
        for i, item in enumerate(self.node.value):
            yield self.child(item, f"[{i}]")

    def free_mapping(self) -> list[tuple[Src, Src]]:
        """(key, value) pairs of a mapping whose keys the caller checks itself."""
        if not isinstance(self.node, yaml.MappingNode):
            self.fail(f"must be a mapping, got {_describe(self.node)}")
        pairs: list[tuple[Src, Src]] = []
        seen: set[str] = set()
        for key_node, value_node in self.node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            key_src = self.child(key_node, key)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                key_src.fail(f"keys must be names, got {_describe(key_node)}")
            if key in seen:
                key_src.fail("appears twice")
            seen.add(key)
            pairs.append((key_src, self.child(value_node, key)))
        return pairs

    # -- scalars ----------------------------------------------------------------------------------

    def _scalar(self) -> yaml.ScalarNode:
        if not isinstance(self.node, yaml.ScalarNode):
            self.fail(f"must be a single value, got {_describe(self.node)}")
        return self.node

    def string(self) -> str:
        node = self._scalar()
        if node.tag != _STR:
            self.fail(f"must be a string, got {node.value!r}")
        value = str(node.value)
        if not value:
            self.fail("must not be empty")
        return value

    def boolean(self) -> bool:
        node = self._scalar()
        if node.tag != _BOOL:
            self.fail(f"must be true or false, got {node.value!r}")
        return str(node.value).lower() in ("true", "yes", "on", "y")

    def integer(self, lo: int | None = None, hi: int | None = None) -> int:
        node = self._scalar()
        value: Any = None
        if node.tag in (_INT, _FLOAT):
            try:  # an explicit tag (!!int x) or a resolver-only form (0b_) does not construct
                value = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
            except (ValueError, OverflowError):
                value = None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            self.fail(f"must be an integer, got {node.value!r}")
        self._check_range(value, lo, hi)
        return int(value)

    def number(self, lo: float | None = None, hi: float | None = None, *, open_lo: bool = False) -> float:
        node = self._scalar()
        text = _float_text(node)
        try:
            if node.tag in (_INT, _FLOAT):
                value = float(yaml.constructor.SafeConstructor().construct_object(node, deep=True))
            elif node.tag == _STR and node.style is None:
                value = float(text)  # YAML 1.1 reads a plain 1e3 as a string; it is meant as a number
            else:
                raise ValueError(text)
        except (ValueError, OverflowError):  # OverflowError: an integer beyond any float
            self.fail(f"must be a number, got {node.value!r}")
        if not math.isfinite(value):
            self.fail(f"must be a finite number, got {node.value!r}")
        if open_lo and lo is not None and value <= lo:
            self.fail(f"{_fmt(value)} must be greater than {_fmt(lo)}")
        self._check_range(value, lo, hi)
        return value

    def _check_range(self, value: float, lo: float | None, hi: float | None) -> None:
        if lo is not None and hi is not None and not lo <= value <= hi:
            self.fail(f"{_fmt(value)} is out of range {_fmt(lo)}..{_fmt(hi)}")
        if lo is not None and value < lo:
            self.fail(f"{_fmt(value)} must be at least {_fmt(lo)}")
        if hi is not None and value > hi:
            self.fail(f"{_fmt(value)} must be at most {_fmt(hi)}")


def _float_text(node: yaml.ScalarNode) -> str:
    return str(node.value).replace("_", "")


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
