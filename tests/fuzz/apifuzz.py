"""Schemathesis over every operation of the hub's OpenAPI document, against the real app in process.

Shared by the bounded test (tests/fuzz/test_api_fuzz.py) and the long run (bench/bench_fuzz.py).
The app is the one ``gpuscope hub`` serves: a DuckDB store, alerting and quality services attached,
lineage and dashboard routes mounted, and a write token, so authorised writes reach the handlers
and schemathesis' ``ignored_auth`` check sends the unauthorised ones.
"""

from __future__ import annotations

import re
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, GenerationMode
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.applications import Starlette
from starlette.routing import Route

from gpuscope.config import HubConfig
from gpuscope.runtime import assemble
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi

TOKEN = "fuzz-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: routes that serve the dashboard's files, not JSON: outside the API document by design
NOT_API = {("GET", "/"), ("GET", "/ui"), ("GET", "/ui/")}


@contextmanager
def hub_app() -> Iterator[Starlette]:
    """The hub's Starlette app as ``gpuscope hub`` builds it, on an in-memory store."""
    cfg = HubConfig(tokens=[TOKEN], storage_path=":memory:")
    runtime = assemble(cfg, store=DuckDBStore(":memory:", durable=False), serve=False)
    try:
        yield HubApi(runtime.hub, tokens=[TOKEN], alerting=runtime.alerting).app
    finally:
        runtime.stop()


def registered_operations(app: Starlette) -> set[tuple[str, str]]:
    """``(METHOD, path)`` of every JSON route the app serves, path parameters as ``{name}``."""
    out = set()
    for route in app.routes:
        if not isinstance(route, Route):
            continue  # the static files mount
        path = re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route.path)
        for method in route.methods or ():
            if method != "HEAD":
                out.add((method, path))
    return out - NOT_API


class FieldNotNamed(Failure):
    """A 4xx whose JSON body does not say which field was wrong."""


def names_the_field(ctx: CheckContext, response: schemathesis.Response, case: schemathesis.Case[Any]) -> bool:
    """Every refusal (4xx) is ``{"error": message, "field": name}`` with both non-empty."""
    if not 400 <= response.status_code < 500:
        return True
    try:
        body = response.json()
    except ValueError:
        body = None
    ok = (
        isinstance(body, dict)
        and isinstance(body.get("field"), str)
        and body["field"] != ""
        and isinstance(body.get("error"), str)
        and body["error"] != ""
    )
    if not ok:
        raise FieldNotNamed(
            operation=case.operation.label,
            title="Refusal does not name the field",
            message=f"{response.status_code} answered {response.text[:200]!r}",
        )
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    names_the_field,
]
#: writes must refuse a missing or wrong token (reads may be open on loopback: web/guard.py)
WRITE_CHECKS = [*CHECKS, ignored_auth]


@dataclass
class FuzzReport:
    operations: list[str] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


def fuzz_api(app: Starlette, examples: int, *, seed: int | None = 0) -> FuzzReport:
    """Fuzz every documented operation with ``examples`` valid and ``examples`` invalid requests.

    A failing operation is recorded (with schemathesis' report and a curl line to reproduce it)
    and the run goes on to the next, so one run lists every problem. ``seed=None`` draws fresh
    inputs each run; otherwise the run is the same every time.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an invalid document fails here, loudly
        report.operations.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz_operation(operation, mode, examples, seed is not None, report)
            except Unsatisfiable:
                pass  # nothing in this operation can be made invalid (no parameters, no body)
            except (Exception, BaseExceptionGroup) as exc:  # recorded: the caller asserts there are none
                report.failures.append(f"{operation.label} ({mode.value}): {_describe(exc)}")
    return report


def _fuzz_operation(
    operation: APIOperation[Any, Any, Any, Any],
    mode: GenerationMode,
    examples: int,
    derandomize: bool,
    report: FuzzReport,
) -> None:
    checks = CHECKS if operation.method.upper() == "GET" else WRITE_CHECKS

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=derandomize,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case[Any]) -> None:
        report.requests[operation.label] += 1
        response = case.call(headers=AUTH)
        report.statuses[response.status_code] += 1
        case.validate_response(response, checks=checks, headers=AUTH)

    run()


def _describe(exc: BaseException) -> str:
    """The exception and, for a group of distinct failures, each of them with its traceback tail."""
    parts = [f"{type(exc).__name__}: {exc}"]
    for sub in getattr(exc, "exceptions", ()):
        parts.append(_describe(sub))
    tb = traceback.format_exception(exc)
    return "\n".join(parts) + "\n" + "".join(tb[-6:])
