"""``gpuscope alerts`` (list, ack, silence, silences, unsilence, history), ``gpuscope incidents``
and ``gpuscope node`` (drain, undrain, drains).

Both talk to a running hub over its HTTP API, as any operator tool would, and print rich tables
ranked by tier and cost of delay (``--json`` prints the API's answer instead).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import sys
import time
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuscope.alert.durations import parse_duration
from gpuscope.cli_client import add_client_options, error_message, unreachable
from gpuscope.tls import client_context

SEVERITY_STYLE = {"P1": "bold red", "P2": "yellow", "P3": "cyan"}


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=200)  # pipes and logs: keep rows whole


def add_alerts_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser)
    sub = parser.add_subparsers(dest="alerts_command")
    ls = sub.add_parser("list", help="firing alerts (default), ranked by tier and cost of delay")
    ls.add_argument("--all", action="store_true", help="include resolved alerts (history)")
    ls.add_argument("--rule", default=None, help="only this rule")
    ack = sub.add_parser(
        "ack", help="acknowledge an alert (al-N) or every firing alert of an incident (inc-N)"
    )
    ack.add_argument("id", help="an alert (al-N) or an incident (inc-N)")
    ack.add_argument("--by", default=getpass.getuser(), help="who acknowledges (default: you)")
    ack.add_argument("--comment", default="", help="a note kept with the acknowledgement")
    sil = sub.add_parser("silence", help="mute matching alerts, e.g. node=node-3 'rule=~\"gpu_.*\"'")
    sil.add_argument("matchers", nargs="+", help="NAME=VALUE, NAME!=VALUE, NAME=~REGEX, NAME!~REGEX")
    sil.add_argument("--for", dest="duration", default="1h", help="how long (30m, 2h, 1d; default 1h)")
    sil.add_argument("--by", default=getpass.getuser(), help="who silences (default: you)")
    sil.add_argument("--comment", default="", help="why (shown with the silence)")
    sils = sub.add_parser("silences", help="list silences")
    sils.add_argument("--expired", action="store_true", help="include expired silences")
    unsil = sub.add_parser("unsilence", help="expire a silence now")
    unsil.add_argument("id", help="a silence id")
    hist = sub.add_parser("history", help="what happened to an alert: fired, notified, acknowledged, ...")
    hist.add_argument("id", help="an alert id (al-N)")
    for command in sub.choices.values():
        add_client_options(command, nested=True)


def add_incidents_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser)
    parser.add_argument("--all", action="store_true", help="include resolved incidents")


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    verify = client_context() if str(args.hub).startswith("https://") else True  # GPUSCOPE_CA_FILE
    return httpx.Client(base_url=args.hub, headers=headers, timeout=10, verify=verify)


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    try:
        with _client(args) as client:
            response = client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise RuntimeError(unreachable(args.hub, exc)) from None
    if response.status_code >= 400:
        raise RuntimeError(f"{method} {path}: HTTP {response.status_code}: {error_message(response)}")
    try:
        return response.json()
    except ValueError:
        raise RuntimeError(error_message(response)) from None


def _ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def dollars_per_hour(value: float) -> str:
    """A cost per hour as a table shows it: cents below $10 (one GPU idle is $0.75 to $4 an hour;
    rounded to whole dollars it read as $1, or $0), whole dollars above."""
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.0f}"


def _entity(entity: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in entity.items())


def _alerts_table(alerts: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, expand=True)
    columns = (
        "id",
        "sev",
        "rule",
        "owner",
        "entity",
        "age",
        "$/h",
        "incident",
        "state",
        "diagnosis / summary",
    )
    for col in columns:
        table.add_column(col, overflow="fold")
    for a in alerts:
        if not a.get("resolved_at"):
            state = "acked" if a.get("ack") else a.get("muted") or "firing"
        else:
            state = "resolved"
        book = (a.get("details") or {}).get("playbook") or {}
        table.add_row(
            a["id"],
            Text(a["severity"], style=SEVERITY_STYLE.get(a["severity"], "")),
            a["rule"],
            a.get("owner") or "-",
            _entity(a["entity"]),
            _ago(a["started_at"]),
            dollars_per_hour(a["cost_per_hour"]),
            a.get("incident") or "-",
            state,
            book.get("summary") or a["summary"],
        )
    return table


def run_alerts(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or _console()
    command = args.alerts_command or "list"
    try:
        if command == "list":
            doc = _call(
                args, "GET", "/api/v1/alerting/alerts", params={"state": "all" if args.all else "firing"}
            )
            rows = [a for a in doc["alerts"] if args.rule in (None, a["rule"])]
            if args.json:
                sys.stdout.write(orjson.dumps({**doc, "alerts": rows}).decode() + "\n")
                return 0
            out.print(_alerts_table(rows, f"{'alerts' if args.all else 'firing alerts'} ({len(rows)})"))
            if doc["pending"]:
                out.print(f"{len(doc['pending'])} pending: " + ", ".join(p["rule"] for p in doc["pending"]))
            return 0
        if command == "ack":
            doc = _call(
                args, "POST", f"/api/v1/alerts/{args.id}/ack", json={"by": args.by, "comment": args.comment}
            )
            out.print(f"acknowledged {', '.join(doc['acknowledged']) or 'nothing (no firing alert)'}")
        elif command == "silence":
            body = {"matchers": args.matchers, "duration": args.duration, "created_by": args.by}
            doc = _call(args, "POST", "/api/v1/silences", json={**body, "comment": args.comment})
            out.print(f"silence {doc['id']} until {_when(doc['ends_at'])}")
        elif command == "silences":
            doc = _call(args, "GET", "/api/v1/silences", params={"expired": str(args.expired).lower()})
            if not args.json:
                out.print(_silences_table(doc["silences"]))
                return 0
        elif command == "unsilence":
            doc = _call(args, "DELETE", f"/api/v1/silences/{args.id}")
            out.print(f"silence {doc['id']} expired")
        elif command == "history":
            doc = _call(args, "GET", f"/api/v1/alerts/{args.id}/history")
            if not args.json:
                table = Table(title=f"history of {args.id}")
                for col in ("time", "what", "detail"):
                    table.add_column(col, overflow="fold")
                for h in doc["history"]:
                    table.add_row(_when(h["ts"]), h["what"], h["detail"])
                out.print(table)
                return 0
        if args.json:
            sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]gpuscope alerts: {escape(str(exc))}[/red]", soft_wrap=True)
        return 1
    return 0


def _silences_table(items: list[dict[str, Any]]) -> Table:
    table = Table(title=f"silences ({len(items)})")
    for col in ("id", "matchers", "until", "by", "comment", "active"):
        table.add_column(col, overflow="fold")
    for s in items:
        matchers = " ".join(f'{m["name"]}{m["op"]}"{m["value"]}"' for m in s["matchers"])
        table.add_row(s["id"], matchers, _when(s["ends_at"]), s["created_by"], s["comment"], str(s["active"]))
    return table


def run_incidents(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or _console()
    try:
        doc = _call(
            args, "GET", "/api/v1/alerting/incidents", params={"state": "all" if args.all else "open"}
        )
    except RuntimeError as exc:
        Console(stderr=True).print(f"[red]gpuscope incidents: {escape(str(exc))}[/red]", soft_wrap=True)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return 0
    table = Table(title=f"incidents ({len(doc['incidents'])}), costliest first", expand=True)
    for col in ("id", "tier", "$/h", "root cause", "alerts", "age", "state", "diagnosis"):
        table.add_column(col, overflow="fold")
    for inc in doc["incidents"]:
        root = f"{inc['root_rule']} on {_entity(inc['root_entity'])}"
        table.add_row(
            inc["id"],
            Text(inc["tier"], style=SEVERITY_STYLE.get(inc["tier"], "")),
            dollars_per_hour(inc["cost_per_hour"]),
            root,
            f"{inc['firing']} firing / {len(inc['members'])}",
            _ago(inc["started_at"]),
            "open" if inc["resolved_at"] is None else "resolved",
            inc.get("diagnosis") or "",
        )
    out.print(table)
    return 0


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="node_command", required=True)
    drain = sub.add_parser("drain", help="take a node out of service: GPU time is maintenance, alerts muted")
    drain.add_argument("node", help="the node's name, as its agent reports it")
    drain.add_argument("--for", dest="duration", default="2h", help="how long (30m, 2h, 1d; default 2h)")
    drain.add_argument("--reason", default="", help="why (shown with the drain and its silence)")
    undrain = sub.add_parser("undrain", help="end a node's drain now")
    undrain.add_argument("node", help="the node's name, as its agent reports it")
    drains = sub.add_parser("drains", help="list drained nodes")
    add_client_options(parser)
    for command in (drain, undrain, drains):
        add_client_options(command, nested=True)


def run_node(args: argparse.Namespace, console: Console | None = None) -> int:
    out = console or _console()
    try:
        if args.node_command == "drain":
            try:
                seconds = parse_duration(args.duration, "--for")
            except ValueError as exc:
                raise RuntimeError(str(exc)) from None
            body = {"for_seconds": seconds, "reason": args.reason}
            doc = _call(args, "POST", f"/api/v1/nodes/{args.node}/drain", json=body)
            text = f"{doc['node']} drained until {_when(doc['until'])}"
            if not args.json:
                out.print(text + (f": {doc['reason']}" if doc["reason"] else ""))
        elif args.node_command == "undrain":
            doc = _call(args, "DELETE", f"/api/v1/nodes/{args.node}/drain")
            if not args.json:
                out.print(f"{doc['node']} back in service")
        else:
            doc = _call(args, "GET", "/api/v1/nodes/drains")
            if not args.json:
                for d in doc["drains"]:
                    out.print(f"{d['node']} until {_when(d['until'])} by {d['by'] or '-'}: {d['reason']}")
                return 0
        if args.json:
            sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    except (httpx.HTTPError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]gpuscope node: {exc}[/red]")
        return 1
    return 0
