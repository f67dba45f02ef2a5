"""``gpuscope lineage ...``: register runs, checkpoints and versions, promote, and ask what changed.

Talks to a hub's lineage API (``--hub``, default ``$GPUSCOPE_HUB``, else the local hub), so the
registry has one owner. Prints the answer for people (a line, a version's tree, a table of
changes; :mod:`gpuscope.lineage.render`), or the hub's JSON with ``--json``; exits 1 with the
hub's message when it refuses, 2 on bad arguments or an unreachable hub.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
import orjson
from rich.console import Console

from gpuscope.cli_client import add_client_options, error_message, unreachable
from gpuscope.lineage.render import render
from gpuscope.tls import client_context

BASE = "/api/v1/lineage"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser)
    sub = parser.add_subparsers(dest="lineage_command", required=True)
    p = sub.add_parser("run", help="register a training run")
    p.add_argument("job", help="the training job's name (as gpuscope.init(job=...))")
    p.add_argument(
        "--meta", action="append", default=[], metavar="KEY=VALUE", help="a fact about the run (repeat)"
    )
    p = sub.add_parser("checkpoint", help="register a checkpoint of a run")
    p.add_argument("job", help="the training job")
    p.add_argument("step", type=int, help="the step the checkpoint was saved at")
    p.add_argument("manifest_hash", help="sha256 of the checkpoint's content manifest (hex)")
    p.add_argument("--path", default="", help="where the checkpoint is stored")
    p = sub.add_parser("register", help="register a model version made from a checkpoint")
    p.add_argument("model", help="the model's name")
    p.add_argument("version", help="the new version's name")
    p.add_argument("--job", required=True, help="the training job the checkpoint is of")
    p.add_argument("--step", type=int, required=True, help="the checkpoint's step")
    p.add_argument(
        "--metric", action="append", default=[], metavar="NAME=NUMBER", help="an evaluation score (repeat)"
    )
    p = sub.add_parser("promote", help="make a version (or @alias) serve a service")
    p.add_argument("service", help="the serving service")
    p.add_argument("model", help="the model's name")
    p.add_argument("version", help="a version or @alias")
    p.add_argument("--traffic", type=float, default=1.0, help="share of traffic (default 1)")
    p.add_argument("--alias", default=None, help="also point this alias (e.g. champion) at it")
    p = sub.add_parser("show", help="a version with its checkpoint, run and deployments")
    p.add_argument("model", help="the model's name")
    p.add_argument("version", help="a version or @alias")
    p = sub.add_parser("changes", help="what changed for a service just before a time")
    p.add_argument("service", help="the serving service")
    p.add_argument("--at", type=float, default=None, help="unix time (default: now)")
    p.add_argument("--window", type=float, default=3600.0, help="seconds to look back (default 3600)")
    for command in sub.choices.values():
        add_client_options(command, nested=True)


def _pairs(items: list[str], numeric: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        try:
            out[key] = float(value) if numeric else value
        except ValueError:
            raise ValueError(f"{item!r}: {value!r} is not a number") from None
    return out


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    c = args.lineage_command
    if c == "run":
        return "POST", "/runs", {"job": args.job, "meta": _pairs(args.meta, False)}, {}
    if c == "checkpoint":
        body = {"job": args.job, "step": args.step, "manifest_hash": args.manifest_hash, "path": args.path}
        return "POST", "/checkpoints", body, {}
    if c == "register":
        body = {
            "model": args.model,
            "version": args.version,
            "job": args.job,
            "step": args.step,
            "metrics": _pairs(args.metric, True),
        }
        return "POST", "/versions", body, {}
    if c == "promote":
        body = {"service": args.service, "model": args.model, "version": args.version}
        body |= {"traffic_share": args.traffic, "alias": args.alias}
        return "POST", "/promotions", body, {}
    if c == "show":
        return "GET", f"/versions/{args.model}/{args.version}", None, {}
    params = {"service": args.service, "window": str(args.window)}
    if args.at is not None:
        params["at"] = str(args.at)
    return "GET", "/changes", None, params


def run(args: argparse.Namespace) -> int:
    hub = str(args.hub)
    try:
        method, path, body, params = _request(args)
    except ValueError as exc:
        print(f"gpuscope lineage: {exc}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        resp = httpx.request(
            method,
            hub.rstrip("/") + BASE + path,
            content=orjson.dumps(body) if body is not None else None,
            params=params,
            headers=headers | {"Content-Type": "application/json"},
            timeout=10.0,
            verify=client_context() if hub.startswith("https://") else True,  # GPUSCOPE_CA_FILE
        )
    except httpx.HTTPError as exc:
        print(f"gpuscope lineage: {unreachable(hub, exc)}", file=sys.stderr)
        return 2
    if resp.status_code >= 400:
        print(f"gpuscope lineage: HTTP {resp.status_code}: {error_message(resp)}", file=sys.stderr)
        return 1
    try:
        doc = resp.json()
    except ValueError:
        print(f"gpuscope lineage: {error_message(resp)}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(doc).decode())
    else:
        console = Console()
        # pipes and logs: rows kept whole
        (console if console.is_terminal else Console(width=200)).print(render(args, doc))
    return 0
