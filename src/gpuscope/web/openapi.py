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
        },
    }
