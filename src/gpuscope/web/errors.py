"""What every HTTP face of the hub shares: the refusal that names its field, and JSON-safe values.

The core API (:mod:`.api`), the alerting, cluster and lineage endpoints all raise
:class:`ApiError`; the guard around every handler turns it into ``{"error": ..., "field": ...}``.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse


class ApiError(Exception):
    """A refusal with its HTTP status and the name of the offending field."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


def refusal_counter(status: int) -> str:
    """The hub counter of refusals with ``status``."""
    return f"api_refused_{status}"


def error_response(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


def json_safe(value: Any) -> Any:
    """NaN/Inf are not JSON; missing values travel as null. Mapping keys become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
