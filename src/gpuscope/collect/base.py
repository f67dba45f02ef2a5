"""The collector seam: one module per telemetry source, each registering itself.

A collector turns one source (host procfs, NVML, a dcgm-exporter endpoint, a simulated node, ...)
into frames and events for one round. The agent runs every collector each round through
:class:`CollectorSet`, which isolates failures: a collector that raises is counted and logged
once per kind of failure, and the round goes on with the others. Roots of ``/proc`` and ``/sys``
are injectable (as in prometheus/client_python) so tests read fixture trees.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self, TypeVar

from gpuscope.counters import Counters
from gpuscope.model import Event, Frame, TrainingRecord

log = logging.getLogger("gpuscope.collect")


@dataclass(frozen=True, slots=True)
class CollectorError:
    """A part of a collector's round that failed while the rest succeeded.

    ``kind`` is a short stable tag (``"snmp_format"``); it decides what is logged once and how
    the failure is counted. ``message`` names what was wrong and where.
    """

    kind: str
    message: str
    #: filled in by :class:`CollectorSet` with the name of the collector that reported it
    collector: str = ""


@dataclass(slots=True)
class Collected:
    """What one collector (or a whole round) produced."""

    frames: list[Frame] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: training records, for collectors that stand in for training processes (the simulator)
    training: list[TrainingRecord] = field(default_factory=list)
    errors: list[CollectorError] = field(default_factory=list)

    def extend(self, other: Collected) -> None:
        self.frames.extend(other.frames)
        self.events.extend(other.events)
        self.training.extend(other.training)
        self.errors.extend(other.errors)

    @property
    def sample_count(self) -> int:
        return sum(f.sample_count for f in self.frames)


@dataclass(frozen=True, slots=True)
class CollectorContext:
    """What the command line knows that a registered collector may need to build itself."""

    node: str
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    #: source-specific settings from the command line, e.g. ``{"dcgm_url": "http://..."}``
    options: Mapping[str, Any] = field(default_factory=dict)


class Collector(ABC):
    """Base class of all collectors. Subclasses set ``name`` and implement :meth:`collect`."""

    name: ClassVar[str]
    #: runs on a real node unless the user picks collectors explicitly
    default: ClassVar[bool] = False
    #: context options that switch this collector on when given (``("dcgm_url",)``)
    enabled_by: ClassVar[tuple[str, ...]] = ()

    def __init__(self, node: str, *, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.node = node
        self.proc_root = proc_root
        self.sys_root = sys_root

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        """Build from command-line context; collectors with other arguments override this."""
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root)

    @abstractmethod
    def collect(self, now: float) -> Collected:
        """One round of readings stamped ``now``. Raise when nothing could be read at all."""

    def close(self) -> None:  # noqa: B027 - optional hook; most collectors hold nothing open
        """Release handles (files, NVML, HTTP clients)."""


COLLECTORS: dict[str, type[Collector]] = {}

C = TypeVar("C", bound=type[Collector])


def register_collector(cls: C) -> C:
    """Class decorator: make a collector available by its ``name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} must set a non-empty class attribute 'name'")
    existing = COLLECTORS.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"collector name {name!r} is already registered by {existing.__qualname__}")
    COLLECTORS[name] = cls
    return cls


def load_collectors() -> dict[str, str]:
    """Import every module of ``gpuscope.collect`` so its collectors register themselves.

    Returns ``{module: reason}`` for modules that could not be imported (a collector whose
    library is absent on this machine); the others stay usable.
    """
    import gpuscope.collect as package

    failed: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = str(exc)
            log.info("collector module %s is not available: %s", info.name, exc)
    return failed


def enabled_collectors(ctx: CollectorContext) -> list[str]:
    """Names of the collectors to run for ``ctx``: the defaults plus those its options switch on."""
    load_collectors()
    return [
        name
        for name, cls in sorted(COLLECTORS.items())
        if cls.default or any(ctx.options.get(opt) for opt in cls.enabled_by)
    ]


def build_collectors(names: Iterable[str], ctx: CollectorContext) -> list[Collector]:
    """Instantiate registered collectors by name; an unknown name is an error naming the choices."""
    load_collectors()
    out: list[Collector] = []
    for name in names:
        cls = COLLECTORS.get(name)
        if cls is None:
            known = ", ".join(sorted(COLLECTORS)) or "none"
            raise ValueError(f"unknown collector {name!r} (registered: {known})")
        out.append(cls.from_context(ctx))
    return out


class CollectorSet:
    """Runs collectors each round with failures isolated, counted, and logged once per kind.

    Counters: ``collector_errors`` (all), ``collector_errors.<collector>`` and
    ``collector_errors.<collector>.<kind>``.
    """

    def __init__(self, collectors: Sequence[Collector], counters: Counters | None = None) -> None:
        names = [c.name for c in collectors]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"collector {dupes[0]!r} is given more than once")
        self.collectors = list(collectors)
        self.counters = counters if counters is not None else Counters()
        self._logged: set[tuple[str, str]] = set()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.collectors]

    def collect(self, now: float) -> Collected:
        """One round from every collector, merged; errors stay listed in the result."""
        out = Collected()
        for collector in self.collectors:
            try:
                got = collector.collect(now)
            except Exception as exc:
                got = Collected(errors=[CollectorError(type(exc).__name__, str(exc) or repr(exc))])
            got.errors = [replace(err, collector=collector.name) for err in got.errors]
            for err in got.errors:
                self._record(collector.name, err)
            out.extend(got)
        return out

    def _record(self, collector: str, err: CollectorError) -> None:
        self.counters.inc("collector_errors")
        self.counters.inc(f"collector_errors.{collector}")
        self.counters.inc(f"collector_errors.{collector}.{err.kind}")
        if (collector, err.kind) not in self._logged:
            self._logged.add((collector, err.kind))
            log.warning(
                "collector %s: %s: %s (logged once; counted as collector_errors.%s.%s)",
                collector,
                err.kind,
                err.message,
                collector,
                err.kind,
            )
        else:
            log.debug("collector %s: %s: %s", collector, err.kind, err.message)

    def close(self) -> None:
        """Close every collector; one failing to close does not keep the others open."""
        for collector in self.collectors:
            try:
                collector.close()
            except Exception as exc:
                self._record(collector.name, CollectorError("close", f"{type(exc).__name__}: {exc}"))
