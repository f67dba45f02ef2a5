"""What ``gpuscope lineage`` prints for people: each answer of the hub's lineage API as a line, a
tree (a version: its checkpoint, run and deployments) or a table (what changed for a service).
``--json`` prints the answer itself instead."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree


def when(ts: Any) -> str:
    """A Unix time as local date and time; ``-`` when absent."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def share(value: Any) -> str:
    """A traffic share (0-1) as a percentage."""
    return f"{float(value) * 100:g} %" if isinstance(value, int | float) else "-"


def pairs(values: Any, numbers: bool = False) -> str:
    """``{"auc": 0.91}`` as ``auc 0.91`` (``key=value`` for facts); ``-`` when empty."""
    if not isinstance(values, dict) or not values:
        return "-"
    if numbers:
        return ", ".join(
            f"{k} {v:g}" if isinstance(v, int | float) else f"{k} {v}" for k, v in values.items()
        )
    return ", ".join(f"{k}={v}" for k, v in values.items())


def checkpoint_text(ck: dict[str, Any]) -> str:
    """``pretrain-7 step 500 (manifest 0123456789ab…, s3://b/500)``."""
    manifest = str(ck.get("manifest_hash", ""))
    where = [f"manifest {manifest[:12]}…" if len(manifest) > 12 else f"manifest {manifest}"]
    if ck.get("path"):
        where.append(str(ck["path"]))
    return f"{ck.get('job')} step {ck.get('step')} ({', '.join(where)})"


def version_tree(doc: dict[str, Any]) -> Tree:
    """A model version with what it came from and where it serves."""
    aliases = " ".join(f"@{a}" for a in doc.get("aliases") or [])
    title = Text.assemble(
        (f"{doc.get('model')} {doc.get('version')}", "bold"), f"  {aliases}" if aliases else ""
    )
    tree = Tree(title)
    tree.add(f"registered {when(doc.get('registered_at'))}")
    tree.add(f"metrics: {escape(pairs(doc.get('metrics'), numbers=True))}")
    ck = doc.get("checkpoint") or {}
    tree.add(f"checkpoint: {escape(checkpoint_text(ck))}, saved {when(ck.get('at'))}")
    run = doc.get("run") or {}
    facts = pairs(run.get("meta"))
    tree.add(
        f"training run: {escape(str(run.get('job')))}, started {when(run.get('started_at'))}"
        + (f", {escape(facts)}" if facts != "-" else "")
    )
    deployments = doc.get("deployments") or []
    served = tree.add("deployments" if deployments else "deployments: none (promote it to serve a service)")
    for d in deployments:
        served.add(
            f"{escape(str(d.get('service')))}: {share(d.get('traffic_share'))} of traffic "
            f"from {when(d.get('promoted_at'))}"
        )
    return tree


def changes_table(doc: dict[str, Any]) -> RenderableType:
    """The promotions of a service within the window, newest first."""
    rows = doc.get("changes") or []
    service, window = doc.get("service"), doc.get("window")
    if not rows:
        span = f"{window:g} s" if isinstance(window, int | float) else "window"
        return Text(f"no promotion of {service} in the {span} before {when(doc.get('at'))}")
    table = Table(title=f"what changed for {service} before {when(doc.get('at'))}")
    for col in ("when", "ago", "model", "version", "replaced", "traffic", "run", "previous run", "metrics"):
        table.add_column(col, overflow="fold")
    for c in rows:
        ago = c.get("seconds_before")
        table.add_row(
            when(c.get("at")),
            f"{ago:.0f} s" if isinstance(ago, int | float) else "-",
            str(c.get("model")),
            str(c.get("version")),
            str(c.get("previous_version") or "-"),
            share(c.get("traffic_share")),
            str(c.get("run") or "-"),
            str(c.get("previous_run") or "-"),
            pairs(c.get("metrics"), numbers=True),
        )
    return table


def render(args: argparse.Namespace, doc: dict[str, Any]) -> RenderableType:
    """The hub's answer to ``gpuscope lineage <command>`` (parsed ``args``), for people."""
    command = args.lineage_command
    if command == "run":
        facts = " ".join(args.meta)
        return Text(f"registered training run {args.job}" + (f" ({facts})" if facts else ""))
    if command == "checkpoint":
        ck = {"job": args.job, "step": args.step, "manifest_hash": args.manifest_hash, "path": args.path}
        return Text(f"registered checkpoint {checkpoint_text(ck)}")
    if command == "register":
        return Group(Text(f"registered {args.model} {args.version}"), version_tree(doc))
    if command == "show":
        return version_tree(doc)
    if command == "promote":
        line = (
            f"{doc.get('model')} {doc.get('version')} now serves {doc.get('service')} "
            f"at {share(doc.get('traffic_share'))} of its traffic"
        )
        source = doc.get("source")
        if isinstance(source, dict):
            line += f", from checkpoint {checkpoint_text(source)}"
        if args.alias:
            line += f"; @{args.alias.lstrip('@')} points at it"
        return Text(line)
    return changes_table(doc)
