"""The OpenAPI 3.1 document the hub publishes at ``/openapi.json``.

Written by hand rather than generated, so that it states the real contract (bounds, required
fields, error shape) precisely enough for clients and for schema-driven fuzzing.
"""

from __future__ import annotations

from typing import Any

_LABELS = {
    "type": "object",
    "additionalProperties": {"type": "string", "maxLength": 256},
    "maxProperties": 32,
}
_NAME = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]{0,127}$"}
_TS = {"type": "number", "minimum": 0}
_ERROR = {
    "description": "Refused; `field` names what was wrong",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error", "field"],
                "properties": {"error": {"type": "string"}, "field": {"type": "string"}},
            }
        }
    },
}
_OK_JSON = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}


def _query(name: str, schema: dict[str, Any], required: bool = False, text: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": text}


_RANGE = [
    _query("start", {"type": "number"}, text="Range start, seconds (default: end - 3600)"),
    _query("end", {"type": "number"}, text="Range end, seconds (default: now)"),
]

BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["source"],
    "additionalProperties": False,
    "properties": {
        "source": {"type": "string", "minLength": 1, "maxLength": 128},
        "batch_id": {"type": "string", "minLength": 1, "maxLength": 128},
        "frames": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ts", "metrics", "entities", "values"],
                "properties": {
                    "ts": _TS,
                    "metrics": {"type": "array", "items": _NAME, "maxItems": 1024},
                    "entities": {"type": "array", "items": _LABELS},
                    "values": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": ["number", "null"]}},
                    },
                },
            },
        },
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ts", "kind"],
                "properties": {"ts": _TS, "kind": _NAME, "labels": _LABELS, "data": {"type": "object"}},
            },
        },
        "training": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ts", "job", "rank", "step"],
                "properties": {
                    "ts": _TS,
                    "job": {"type": "string", "minLength": 1, "maxLength": 256},
                    "rank": {"type": "integer", "minimum": 0},
                    "step": {"type": "integer", "minimum": 0},
                    "metrics": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
                    "labels": _LABELS,
                },
            },
        },
    },
}


def _op(
    summary: str, *, params: list[dict[str, Any]] | None = None, body: bool = False, write: bool = False
) -> dict[str, Any]:
    """A plain operation: JSON in (when ``body``), JSON out, refusals naming the field."""
    out: dict[str, Any] = {"summary": summary, "responses": {"200": _OK_JSON, "400": _ERROR, "404": _ERROR}}
    if write:
        out["responses"] |= {"401": _ERROR, "403": _ERROR, "413": _ERROR}
    if params:
        out["parameters"] = params
    if body:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    return out


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


_ALERTING_PATHS: dict[str, Any] = {
    "/api/v1/alerting/alerts": {"get": _op("Alerts ranked by cost of delay, with playbook results")},
    "/api/v1/alerting/incidents": {"get": _op("Incidents ranked by cost, root cause first")},
    "/api/v1/alerting/status": {"get": _op("Receivers, outbox backlog, silences, maintenance")},
    "/api/v1/alerts/{id}/ack": {
        "post": _op(
            "Acknowledge an alert (al-N) or a whole incident (inc-N)",
            params=[_path("id")],
            body=True,
            write=True,
        )
    },
    "/api/v1/alerts/{id}/history": {
        "get": _op("An alert's notifications and state changes", params=[_path("id")])
    },
    "/api/v1/silences": {
        "get": _op("Active silences"),
        "post": _op("Add a silence: matchers, expiry, author, comment", body=True, write=True),
    },
    "/api/v1/silences/{id}": {"delete": _op("Expire a silence", params=[_path("id")], write=True)},
}

_LINEAGE_PATHS: dict[str, Any] = {
    "/api/v1/lineage/runs": {"post": _op("Register a training run", body=True, write=True)},
    "/api/v1/lineage/checkpoints": {
        "post": _op("Register a checkpoint (job, step, manifest hash)", body=True, write=True)
    },
    "/api/v1/lineage/versions": {
        "post": _op("Register a model version from a checkpoint", body=True, write=True)
    },
    "/api/v1/lineage/promotions": {
        "post": _op("Promote a version to a service (traffic share, alias)", body=True, write=True)
    },
    "/api/v1/lineage/versions/{model}/{version}": {
        "get": _op(
            "A version with its checkpoint, training run, aliases and deployments",
            params=[_path("model"), _path("version")],
        )
    },
    "/api/v1/lineage/deployments": {
        "get": _op(
            "Deployments, by service or model",
            params=[_query("service", {"type": "string"}), _query("model", {"type": "string"})],
        )
    },
    "/api/v1/lineage/changes": {
        "get": _op(
            "What changed on a service just before a time",
            params=[
                _query("service", {"type": "string"}, True),
                _query("at", {"type": "number"}),
                _query("window", {"type": "number", "minimum": 0}),
            ],
        )
    },
}

_UI_PATHS: dict[str, Any] = {
    f"/api/v1/ui/{page}": {"get": _op(f"Data behind the dashboard's {page} page")}
    for page in ("fleet", "node", "jobs", "job", "services", "service", "reports", "capabilities")
}


def openapi_document(version: str) -> dict[str, Any]:
    errors = {"400": _ERROR, "401": _ERROR, "403": _ERROR}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpuscope hub",
            "version": version,
            "description": "Ingest GPU, training and inference telemetry; query series, alerts.",
        },
        "paths": {
            "/api/v1/ingest": {
                "post": {
                    "summary": "Ingest one batch; answered once the batch is durable",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": BATCH_SCHEMA}},
                    },
                    "responses": {"200": _OK_JSON, **errors, "413": _ERROR, "415": _ERROR},
                }
            },
            "/api/v1/series": {
                "get": {
                    "summary": "One series over a range, downsampled to at most `points` points",
                    "parameters": [
                        _query("metric", _NAME, True),
                        *_RANGE,
                        _query("points", {"type": "integer", "minimum": 1, "maximum": 10000}),
                    ],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/snapshot": {
                "get": {
                    "summary": "Latest value of each metric for every entity (fleet view)",
                    "parameters": [
                        _query("metrics", {"type": "string"}, text="Comma-separated metric names"),
                        _query("max_age", {"type": "number", "minimum": 0}),
                    ],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/aggregate": {
                "get": {
                    "summary": "Mean/min/max/count of a metric grouped by a label (node, job, ...)",
                    "parameters": [_query("metric", _NAME, True), _query("by", _NAME, True), *_RANGE],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/events": {
                "get": {
                    "summary": "Events in a range",
                    "parameters": [
                        *_RANGE,
                        _query("kind", _NAME),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 100000}),
                    ],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/training": {
                "get": {
                    "summary": "Training records of a job",
                    "parameters": [
                        _query("job", {"type": "string", "minLength": 1, "maxLength": 256}, True),
                        *_RANGE,
                        _query("rank", {"type": "integer", "minimum": 0}),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000000}),
                    ],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/alerts": {
                "get": {
                    "summary": "Alerts, firing or all",
                    "parameters": [
                        _query("state", {"type": "string", "enum": ["firing", "all"]}),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 100000}),
                    ],
                    "responses": {"200": _OK_JSON, **errors},
                }
            },
            "/api/v1/incidents": {
                "get": {"summary": "Incidents, root cause first", "responses": {"200": _OK_JSON}}
            },
            "/api/v1/health": {
                "get": {
                    "summary": "Liveness, counters of refusals and drops, store stats",
                    "responses": {"200": _OK_JSON},
                }
            },
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": _OK_JSON}}},
            **_ALERTING_PATHS,
            **_LINEAGE_PATHS,
            **_UI_PATHS,
        },
    }
