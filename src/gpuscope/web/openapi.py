"""The OpenAPI 3.1 document the hub publishes at ``/openapi.json``.

Written by hand rather than generated, so that it states the real contract (bounds, required
fields, error shape) precisely enough for clients and for schema-driven fuzzing.
"""

from __future__ import annotations

from typing import Any

from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_CONTENT_TYPE

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
_INT = {"type": "integer", "minimum": 0}
_INGESTED = {
    "description": "Stored (durable); what was accepted, refused (over the store's bounds) or a duplicate",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["accepted", "refused", "duplicate", "notes"],
                "properties": {
                    "accepted": {
                        "type": "object",
                        "required": ["samples", "events", "training"],
                        "properties": {"samples": _INT, "events": _INT, "training": _INT},
                    },
                    "refused": {
                        "type": "object",
                        "required": ["entities", "samples"],
                        "properties": {"entities": _INT, "samples": _INT},
                    },
                    "duplicate": {"type": "boolean"},
                    "notes": {"type": "array", "items": {"type": "string"}},
                },
            }
        }
    },
}


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


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


_STR = {"type": "string", "minLength": 1, "maxLength": 128}
_LINEAGE_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}$"}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_MATCHER = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        _obj(["name", "value"], name=_NAME, op={"enum": ["=", "!=", "=~", "!~"]}, value={"type": "string"}),
    ]
}
#: what each write operation reads from its JSON body (other keys are ignored)
BODIES: dict[str, dict[str, Any]] = {
    "ack": _obj([], by=_STR, comment={"type": "string", "maxLength": 1024}),
    "drain": _obj(
        ["for_seconds"],
        for_seconds={"type": "number", "exclusiveMinimum": 0, "maximum": 30 * 86400},
        reason={"type": "string", "maxLength": 1000},
    ),
    "silence": _obj(
        ["matchers"],
        matchers={
            "oneOf": [
                {"type": "object", "additionalProperties": {"type": "string"}},
                {"type": "array", "items": _MATCHER},
            ]
        },
        duration={"oneOf": [{"type": "string", "pattern": "^([0-9.]+[smhdw])+$"}, {"type": "number"}]},
        starts_at={"type": "number", "minimum": 0},
        created_by=_STR,
        comment={"type": "string", "maxLength": 1024},
    ),
    "run": _obj(["job"], job=_LINEAGE_NAME, meta={"type": "object"}, started_at={"type": "number"}),
    "checkpoint": _obj(
        ["job", "step", "manifest_hash"],
        job=_LINEAGE_NAME,
        step=_COUNT,
        manifest_hash={"type": "string", "pattern": "^[0-9a-fA-F]{8,128}$"},
        path={"type": "string"},
        at={"type": "number", "minimum": 0},
    ),
    "version": _obj(
        ["model", "version", "job", "step"],
        model=_LINEAGE_NAME,
        version=_LINEAGE_NAME,
        job=_LINEAGE_NAME,
        step=_COUNT,
        metrics={"type": "object", "additionalProperties": {"type": "number"}},
        at={"type": "number", "minimum": 0},
    ),
    "promotion": _obj(
        ["service", "model", "version"],
        service=_LINEAGE_NAME,
        model=_LINEAGE_NAME,
        version=_LINEAGE_NAME,
        traffic_share={"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        alias={"type": "string", "pattern": "^@?[a-z][a-z0-9_-]{0,31}$"},
        at={"type": "number", "minimum": 0},
    ),
}


def _op(
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: str | None = None,
    write: bool = False,
    created: bool = False,
) -> dict[str, Any]:
    """A plain operation: JSON in (the schema ``BODIES[body]``), JSON out, refusals naming the field."""
    ok = {"201" if created else "200": _OK_JSON}
    out: dict[str, Any] = {"summary": summary, "responses": {**ok, "400": _ERROR, "404": _ERROR}}
    if write:
        out["responses"] |= {"401": _ERROR, "403": _ERROR, "409": _ERROR, "413": _ERROR}
    if params:
        out["parameters"] = params
    if body:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": BODIES[body]}}}
    return out


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


_ALERTING_PATHS: dict[str, Any] = {
    "/api/v1/alerting/alerts": {
        "get": _op(
            "Alerts ranked by cost of delay, with playbook results",
            params=[_query("state", {"type": "string", "enum": ["firing", "all"]})],
        )
    },
    "/api/v1/alerting/incidents": {
        "get": _op(
            "Incidents ranked by cost, root cause first",
            params=[_query("state", {"type": "string", "enum": ["open", "all"]})],
        )
    },
    "/api/v1/alerting/status": {"get": _op("Receivers, outbox backlog, silences, maintenance")},
    "/api/v1/alerts/{id}/ack": {
        "post": _op(
            "Acknowledge an alert (al-N) or a whole incident (inc-N)",
            params=[_path("id")],
            body="ack",
            write=True,
        )
    },
    "/api/v1/alerts/{id}/history": {
        "get": _op("An alert's notifications and state changes", params=[_path("id")])
    },
    "/api/v1/silences": {
        "get": _op(
            "Active silences", params=[_query("expired", {"type": "string", "enum": ["true", "false"]})]
        ),
        "post": _op(
            "Add a silence: matchers, expiry, author, comment", body="silence", write=True, created=True
        ),
    },
    "/api/v1/silences/{id}": {"delete": _op("Expire a silence", params=[_path("id")], write=True)},
}

_LINEAGE_PATHS: dict[str, Any] = {
    "/api/v1/lineage/runs": {"post": _op("Register a training run", body="run", write=True)},
    "/api/v1/lineage/checkpoints": {
        "post": _op("Register a checkpoint (job, step, manifest hash)", body="checkpoint", write=True)
    },
    "/api/v1/lineage/versions": {
        "post": _op("Register a model version from a checkpoint", body="version", write=True)
    },
    "/api/v1/lineage/promotions": {
        "post": _op("Promote a version to a service (traffic share, alias)", body="promotion", write=True)
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

_STALE = _query("stale_after", {"type": "number", "minimum": 1, "maximum": 86400})
_UI_TS = {"type": "number", "minimum": 0, "maximum": 1e11}
_PRODUCTIVITY_PATHS: dict[str, Any] = {
    "/api/v1/productivity": {
        "get": _op(
            "GPU-hours and dollars per state (productive, degraded, busy_not_productive, idle_allocated, "
            "idle_unallocated, down, maintenance) and cause, with owners, per group; `now`: GPUs per state",
            params=[
                _query("by", {"enum": ["fleet", "node", "job", "team", "service"]}, text="grouping"),
                _query(
                    "range", {"type": "string", "pattern": "^[1-9][0-9]{0,5}[smhd]$"}, text="e.g. 1h, 30d"
                ),
                _query("start", _UI_TS),
                _query("end", _UI_TS),
            ],
        )
    },
    "/api/v1/productivity/gpus": {"get": _op("Each GPU's state now, with cause, owner and since when")},
    "/api/v1/nodes/drains": {"get": _op("Nodes drained for maintenance, and until when")},
    "/api/v1/nodes/{node}/drain": {
        "post": _op(
            "Drain a node for `for_seconds`: its GPU time counts as maintenance, its alerts are silenced",
            params=[_path("node")],
            body="drain",
            write=True,
        ),
        "delete": _op("End a node's drain", params=[_path("node")], write=True),
    },
}
_UI_PARAMS: dict[str, list[dict[str, Any]]] = {
    "fleet": [
        _query("metric", {"type": "string"}, text="A per-GPU gauge"),
        _STALE,
        _query("start", _UI_TS, text="GPU time per state from (default: an hour before end)"),
        _query("end", _UI_TS),
    ],
    "node": [_query("node", {"type": "string", "minLength": 1, "maxLength": 256}, True), _STALE],
    "job": [
        _query("job", {"type": "string", "minLength": 1, "maxLength": 256}, True),
        _query("start", _UI_TS),
        _query("end", _UI_TS),
        _query("points", {"type": "integer", "minimum": 10, "maximum": 2000}),
    ],
    "service": [_query("service", {"type": "string", "minLength": 1, "maxLength": 256}, True)],
    "reports": [
        _query("range", {"type": "number", "minimum": 60, "maximum": 366 * 86400}, text="Seconds back"),
        _query("days", {"type": "integer", "minimum": 1, "maximum": 366}, text="Days back (when no range)"),
    ],
}
_UI_PATHS: dict[str, Any] = {
    f"/api/v1/ui/{page}": {
        "get": _op(f"Data behind the dashboard's {page} page", params=_UI_PARAMS.get(page))
    }
    for page in ("fleet", "node", "jobs", "job", "services", "service", "reports", "capabilities")
}


def openapi_document(version: str) -> dict[str, Any]:
    from gpuscope.web.guard import document_security

    errors = {"400": _ERROR, "401": _ERROR, "403": _ERROR}
    return document_security(
        {
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
                            "content": {
                                "application/json": {"schema": BATCH_SCHEMA},
                                # the same batch as a binary frame: docs/wire-format.md
                                FRAME_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
                            },
                        },
                        "responses": {
                            "200": _INGESTED,
                            **errors,
                            "413": _ERROR,
                            "415": _ERROR,
                            "503": _ERROR,  # not stored ("storage") or hub behind ("hub"): Retry-After
                            "507": _ERROR,  # the hub's disk is full: retry later
                        },
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
                        "summary": "Liveness, counters of refusals and drops, store stats; on a sharded "
                        "hub also `cluster`: hub_id, live members, owned shards",
                        "responses": {"200": _OK_JSON},
                    }
                },
                "/api/v1/cluster/forward": {
                    "post": _op(
                        "Sharded hubs only: a peer passes on the parts of a batch this hub detects for "
                        "(body as /api/v1/ingest; cluster.peer_token as bearer; header x-gpuscope-hops)",
                        write=True,
                    )
                },
                "/openapi.json": {"get": {"summary": "This document", "responses": {"200": _OK_JSON}}},
                **_ALERTING_PATHS,
                **_LINEAGE_PATHS,
                **_UI_PATHS,
                **_PRODUCTIVITY_PATHS,
                "/api/v1/audit": {
                    "get": _op(
                        "Admin actions, most recent first: token name, action, target, time, source",
                        params=[
                            _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
                            _query("since", {"type": "number"}),
                        ],
                    )
                },
            },
        }
    )
