"""The PromQL subset Grafana panels use, parsed into a small tree.

Selectors with ``=``, ``!=``, ``=~``, ``!~`` matchers and ``[range]``; the functions in
:data:`FUNCTIONS`; the aggregations in :data:`AGGREGATIONS` with ``by``/``without`` before or after
their argument; ``+ - * /`` and comparisons with Prometheus' precedence; numbers and durations.
Anything else is refused with the position and the token, never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FUNCTIONS = {
    "rate": "range",
    "irate": "range",
    "increase": "range",
    "delta": "range",
    "avg_over_time": "range",
    "min_over_time": "range",
    "max_over_time": "range",
    "sum_over_time": "range",
    "count_over_time": "range",
    "last_over_time": "range",
    "quantile_over_time": "quantile",
    "abs": "instant",
}
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count"})
MATCH_OPS = ("=~", "!~", "!=", "=")
# bounds instead of a stack overflow: parentheses, calls and aggregations inside each other, and
# binary operators (a chain of them is a tree as deep as it is long)
MAX_DEPTH = 64
MAX_OPERATORS = 200
# binary operators by precedence, loosest first (Prometheus: comparisons < + - < * / %)
PRECEDENCE = (("==", "!=", ">=", "<=", ">", "<"), ("+", "-"), ("*", "/"))
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+)(?![A-Za-z0-9_])
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/(){}\[\],=<>])
    )""",
    re.VERBOSE,
)


class PromQLError(ValueError):
    """A query outside the subset, or malformed; the message names the position."""


@dataclass(frozen=True, slots=True)
class Number:
    value: float


@dataclass(frozen=True, slots=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()
    range_s: float | None = None


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Aggregate:
    op: str
    expr: Expr
    grouping: tuple[str, ...] = ()
    without: bool = False


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    lhs: Expr
    rhs: Expr


Expr = Number | Selector | Call | Aggregate | Binary


def parse_duration(text: str) -> float:
    """``5m``, ``1h30m``, ``250ms`` in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise PromQLError(f"{text!r} is not a duration such as 5m")
    return sum(int(n) * _UNITS[u] for n, u in parts)


@dataclass(slots=True)
class _Tokens:
    items: list[tuple[str, str, int]]
    pos: int = 0
    text: str = field(default="")
    depth: int = 0
    operators: int = 0

    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        i = self.pos + ahead
        return self.items[i] if i < len(self.items) else ("end", "", len(self.text))

    def take(self) -> tuple[str, str, int]:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, value: str) -> None:
        kind, got, at = self.take()
        if got != value or kind not in ("op", "name"):
            raise PromQLError(f"at {at}: expected {value!r}, got {got or 'the end'!r}")


def _tokens(text: str) -> _Tokens:
    items: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            raise PromQLError(f"at {pos}: unexpected {text[pos : pos + 10]!r}")
        items.append((m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)))
        pos = m.end()
    return _Tokens(items, text=text)


def _string(raw: str) -> str:
    body = raw[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _matchers(t: _Tokens) -> list[tuple[str, str, str]]:
    t.expect("{")
    out: list[tuple[str, str, str]] = []
    while t.peek()[1] != "}":
        kind, name, at = t.take()
        if kind != "name":
            raise PromQLError(f"at {at}: expected a label name, got {name!r}")
        _, op, at = t.take()
        if op not in MATCH_OPS:
            raise PromQLError(f"at {at}: expected one of {', '.join(MATCH_OPS)}, got {op!r}")
        kind, value, at = t.take()
        if kind != "string":
            raise PromQLError(f"at {at}: expected a quoted label value, got {value!r}")
        out.append((name, op, _string(value)))
        if t.peek()[1] == ",":
            t.take()
    t.take()
    return out


def _range(t: _Tokens) -> float | None:
    if t.peek()[1] != "[":
        return None
    t.take()
    kind, value, at = t.take()
    if kind != "duration":
        raise PromQLError(f"at {at}: expected a range such as 5m, got {value!r}")
    t.expect("]")
    return parse_duration(value)


def _grouping(t: _Tokens) -> tuple[tuple[str, ...], bool] | None:
    word = t.peek()[1]
    if word not in ("by", "without"):
        return None
    t.take()
    t.expect("(")
    labels: list[str] = []
    while t.peek()[1] != ")":
        kind, name, at = t.take()
        if kind != "name":
            raise PromQLError(f"at {at}: expected a label name, got {name!r}")
        labels.append(name)
        if t.peek()[1] == ",":
            t.take()
    t.take()
    return tuple(labels), word == "without"


def _primary(t: _Tokens) -> Expr:
    t.depth += 1
    try:
        return _nested(t)
    finally:
        t.depth -= 1


def _nested(t: _Tokens) -> Expr:
    kind, value, at = t.peek()
    if t.depth > MAX_DEPTH:
        raise PromQLError(f"at {at}: nested more than {MAX_DEPTH} levels deep")
    if value == "(" and kind == "op":
        t.take()
        inner = _binary(t, 0)
        t.expect(")")
        return inner
    if value == "-" and kind == "op":
        t.take()
        return Binary("*", Number(-1.0), _primary(t))
    if kind == "number":
        t.take()
        return Number(float(value))
    if kind == "duration":
        t.take()
        return Number(parse_duration(value))
    if kind == "op" and value == "{":
        matchers = _matchers(t)
        names = [v for n, op, v in matchers if n == "__name__" and op == "="]
        if not names:
            raise PromQLError(f"at {at}: a selector needs a metric name")
        rest = tuple(m for m in matchers if not (m[0] == "__name__" and m[1] == "="))
        return Selector(names[0], rest, _range(t))
    if kind != "name":
        raise PromQLError(f"at {at}: unexpected {value or 'end of query'!r}")
    t.take()
    if value in AGGREGATIONS:
        grouping = _grouping(t)
        t.expect("(")
        inner = _binary(t, 0)
        t.expect(")")
        grouping = grouping or _grouping(t) or ((), False)
        return Aggregate(value, inner, grouping[0], grouping[1])
    if t.peek()[1] == "(":
        if value not in FUNCTIONS:
            raise PromQLError(
                f"at {at}: function {value!r} is not supported (known: {', '.join(sorted(FUNCTIONS))})"
            )
        t.take()
        args: list[Expr] = []
        while t.peek()[1] != ")":
            args.append(_binary(t, 0))
            if t.peek()[1] == ",":
                t.take()
        t.take()
        want = 2 if FUNCTIONS[value] == "quantile" else 1
        if len(args) != want:
            raise PromQLError(f"at {at}: {value} takes {want} argument(s), got {len(args)}")
        last = args[-1]
        if FUNCTIONS[value] != "instant" and not (isinstance(last, Selector) and last.range_s):
            raise PromQLError(f"at {at}: {value} needs a range selector such as metric[5m]")
        return Call(value, tuple(args))
    matchers = _matchers(t) if t.peek()[1] == "{" else []
    return Selector(value, tuple(matchers), _range(t))


def _binary(t: _Tokens, level: int) -> Expr:
    if level == len(PRECEDENCE):
        return _primary(t)
    lhs = _binary(t, level + 1)
    while t.peek()[0] == "op" and t.peek()[1] in PRECEDENCE[level]:
        op, at = t.take()[1:]
        t.operators += 1
        if t.operators > MAX_OPERATORS:
            raise PromQLError(f"at {at}: more than {MAX_OPERATORS} operators in one query")
        lhs = Binary(op, lhs, _binary(t, level + 1))
    return lhs


def parse(text: str) -> Expr:
    """The tree of one query; PromQLError naming the position when it is outside the subset."""
    t = _tokens(text)
    expr = _binary(t, 0)
    kind, value, at = t.peek()
    if kind != "end":
        raise PromQLError(f"at {at}: unexpected {value!r}")
    return expr
