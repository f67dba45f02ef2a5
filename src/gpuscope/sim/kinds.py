"""The fault kinds of DESIGN §4: what each one targets, its parameters with defaults, and its rule.

The table is data (``kinds.yaml`` beside this module), read once by :func:`load_kinds`, which
refuses a row it cannot use with the file, the kind and the field named. The parser validates
scenario files against the table and the simulator looks up effects by the same names, so a kind
cannot be accepted by one and unknown to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuscope.rules import GPU_XID_APP, GPU_XID_FATAL, RULES
from gpuscope.signals import APP_XIDS

ParamValue = float | int | str | bool

GPU_TARGET = ("node", "gpu")
NODE_TARGET = ("node",)
JOB_TARGET = ("job",)
RANK_TARGET = ("job", "rank")
SERVICE_TARGET = ("service",)


@dataclass(frozen=True, slots=True)
class Param:
    """One fault parameter: its type, default and allowed range or choices."""

    default: ParamValue
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""

    @property
    def type(self) -> type:
        return type(self.default)


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    rule: str
    target: tuple[str, ...]
    params: dict[str, Param] = field(default_factory=dict)
    #: "training" or "inference" when the targeted job must be of that kind; None for any job
    job_kind: str | None = None
    #: False for kinds that are accepted (ground truth for scoring) but have no signals yet
    simulated: bool = True


TABLE = Path(__file__).with_name("kinds.yaml")
_TARGETS = {
    "gpu": GPU_TARGET,
    "node": NODE_TARGET,
    "job": JOB_TARGET,
    "rank": RANK_TARGET,
    "service": SERVICE_TARGET,
}
#: libyaml's safe loader where PyYAML was built with it: the table is read at every start
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KIND_KEYS = frozenset({"rule", "target", "job", "simulated", "params"})
_PARAM_KEYS = frozenset({"default", "lo", "hi", "choices", "help"})


class KindTableError(ValueError):
    """The fault-kind table has a row the loader cannot use; the message names the field."""


def _param(where: str, row: object) -> Param:
    if not isinstance(row, dict) or not set(row) <= _PARAM_KEYS or "default" not in row:
        raise KindTableError(f"{where}: a mapping with default and any of lo, hi, choices, help")
    default = row["default"]
    if not isinstance(default, bool | int | float | str):
        raise KindTableError(f"{where}.default: {default!r} is not a flag, number or text")
    bounds: list[float | None] = []
    for key in ("lo", "hi"):
        value = row.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or isinstance(default, bool | str)
        ):
            raise KindTableError(f"{where}.{key}: {value!r} is not a bound of a number")
        bounds.append(None if value is None else float(value))
    choices = row.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise KindTableError(f"{where}.choices: a list of text")
    if choices and (not isinstance(default, str) or default not in choices):
        raise KindTableError(f"{where}.default: {default!r} is not one of its choices")
    return Param(default, bounds[0], bounds[1], tuple(choices), str(row.get("help", "")))


def _kind(name: str, row: object, source: str) -> FaultKind:
    where = f"{source}: {name}"
    if not isinstance(row, dict) or not set(row) <= _KIND_KEYS:
        raise KindTableError(f"{where}: a mapping of {', '.join(sorted(_KIND_KEYS))}")
    rule = row.get("rule", name)
    if rule not in RULES:
        raise KindTableError(f"{where}.rule: {rule!r} is not a rule of gpuscope.rules")
    target = _TARGETS.get(row.get("target", ""))
    if target is None:
        raise KindTableError(f"{where}.target: one of {', '.join(_TARGETS)}")
    job = row.get("job")
    if job not in (None, "training", "inference"):
        raise KindTableError(f"{where}.job: training or inference, not {job!r}")
    simulated = row.get("simulated", True)
    if not isinstance(simulated, bool):
        raise KindTableError(f"{where}.simulated: true or false")
    params: Any = row.get("params") or {}
    if not isinstance(params, dict):
        raise KindTableError(f"{where}.params: a mapping of parameter names")
    return FaultKind(
        name,
        rule,
        target,
        {str(p): _param(f"{where}.params.{p}", spec) for p, spec in params.items()},
        job,
        simulated,
    )


def load_kinds(text: str, source: str = TABLE.name) -> dict[str, FaultKind]:
    """Every fault kind of a table in the format of ``kinds.yaml``, in its order."""
    rows = yaml.load(text, Loader=_LOADER)
    if not isinstance(rows, dict) or not rows:
        raise KindTableError(f"{source}: a mapping of fault kinds")
    return {str(name): _kind(str(name), row, source) for name, row in rows.items()}


FAULT_KINDS: dict[str, FaultKind] = load_kinds(TABLE.read_text(encoding="utf-8"))


def rule_for_fault(kind: str, params: dict[str, object] | None = None) -> str:
    """The rule a fault must raise; an ``xid`` maps by its code (default 79, fatal)."""
    if kind == "xid":
        code = (params or {}).get("code", 79)
        return GPU_XID_APP if isinstance(code, int) and code in APP_XIDS else GPU_XID_FATAL
    return FAULT_KINDS[kind].rule


#: Hard faults: their rule fires at once, and the time-to-detect budget applies to them.
HARD_FAULTS: frozenset[str] = frozenset(name for name, kind in FAULT_KINDS.items() if RULES[kind.rule].hard)
