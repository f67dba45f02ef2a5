"""``gpuscope agent``: its arguments and what runs them (wired into ``gpuscope.cli``).

Which collectors run: the registered defaults (the host collector), plus any whose option is
given (``--dcgm-url`` switches on the collector that declares ``enabled_by = ("dcgm_url",)``), or
exactly those named with ``--collector``. An option that no installed collector handles is an
error rather than silently ignored.

Exit status: 0 after SIGINT/SIGTERM, 2 on bad arguments or setup, :data:`EXIT_TOKEN_REFUSED` (77,
``EX_NOPERM``) when the hub refuses the agent's token: said once, with the hub's reason and never
the token. Retrying inside the process could not succeed until the token or the hub's
``auth.tokens`` change, and a process that keeps running while it delivers nothing looks healthy
to systemd and Kubernetes. Their restart policy retries (the shipped unit every 5 s, a DaemonSet
with back-off), the failure shows as a failed unit or a crash-looping pod, and what was collected
stays in the spool for the start that gets through.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import orjson

from gpuscope.agent.agent import Agent, collect_once_json, default_node_name, run_until_signalled
from gpuscope.agent.metrics_endpoint import MetricsEndpoint, PublishingCollectorSet, parse_listen, serve_only
from gpuscope.agent.sender import TokenRefused
from gpuscope.agent.spool import SpoolError
from gpuscope.collect.base import (
    COLLECTORS,
    Collector,
    CollectorContext,
    build_collectors,
    enabled_collectors,
    load_collectors,
)
from gpuscope.huburl import hub_urls
from gpuscope.tls import TlsSettings

log = logging.getLogger("gpuscope.agent")

#: the exit status when the hub refuses the agent's token (sysexits.h EX_NOPERM)
EXIT_TOKEN_REFUSED = 77

#: command-line flag -> collector option it sets
SOURCE_FLAGS = {
    "--dcgm-url": "dcgm_url",
    "--scrape": "scrape_urls",
    "--slurm": "slurm",
    "--kubelet-socket": "kubelet_socket",
}


#: the collectors that read GPUs; without one (and none chosen by name) the agent says so
GPU_COLLECTORS = frozenset({"nvml", "dcgm"})
NO_GPU_SOURCE = (
    "no GPU source: the NVML library (libnvidia-ml.so, from the NVIDIA driver) was not found and no "
    "--dcgm-url is given, so only host metrics are collected"
)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hub",
        type=hub_urls,
        default=None,
        help="hub base URL, e.g. http://hub:7470, or several separated by commas (not needed with --once)",
    )
    parser.add_argument("--node", default=None, help="this node's name (default: the short host name)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds (default 1)")
    parser.add_argument(
        "--send-spread",
        type=float,
        default=None,
        metavar="SECONDS",
        help="send each round at its tick plus this node's offset in [0, SECONDS), a hash of its "
        "name, so a fleet does not post on the same instant (default: half the interval; 0: at the tick)",
    )
    parser.add_argument("--token", default=None, help="bearer token for the hub (default: $GPUSCOPE_TOKEN)")
    parser.add_argument(
        "--ca-file",
        default=None,
        help="CA file for an https:// hub (default: $GPUSCOPE_CA_FILE, else the system's)",
    )
    parser.add_argument(
        "--metrics-tls-cert", default=None, help="serve --metrics-listen over TLS: cert (PEM)"
    )
    parser.add_argument("--metrics-tls-key", default=None, help="and its private key (PEM)")
    parser.add_argument(
        "--spool-dir", default=None, help="where batches wait while the hub is away (default: ~/.local/state)"
    )
    parser.add_argument("--spool-max-mb", type=float, default=256.0, help="spool bound in MiB (default 256)")
    parser.add_argument(
        "--collector",
        action="append",
        default=None,
        metavar="NAME",
        help="run exactly these collectors (repeatable; default: host plus those switched on by options)",
    )
    parser.add_argument("--dcgm-url", default=None, help="an existing dcgm-exporter /metrics URL")
    parser.add_argument(
        "--kubelet-socket",
        default=None,
        help="the kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--kube-api",
        action="store_true",
        help="with --kubelet-socket: pod UID, workload and team from the API server (in-cluster account)",
    )
    parser.add_argument(
        "--team-label", default=None, help="the pod label that names a pod's team (default: team)"
    )
    parser.add_argument(
        "--slurm", action="store_true", help="read the Slurm queue and node states (squeue/sinfo --json)"
    )
    parser.add_argument(
        "--scrape", action="append", default=None, metavar="URL", help="a vLLM/Triton/TGI/SGLang /metrics URL"
    )
    parser.add_argument("--proc-root", default="/proc", help="read procfs from this root (default /proc)")
    parser.add_argument("--sys-root", default="/sys", help="read sysfs from this root (default /sys)")
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve the latest round as Prometheus /metrics here (without --hub: only that)",
    )
    parser.add_argument("--once", action="store_true", help="one round from every source, printed; no hub")
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument(
        "--rate-window",
        type=float,
        default=0.5,
        help="with --once: seconds between the two readings rates need",
    )


def context_from_args(args: argparse.Namespace) -> CollectorContext:
    options: dict[str, Any] = {}
    if args.dcgm_url:
        options["dcgm_url"] = args.dcgm_url
    if args.scrape:
        options["scrape_urls"] = list(args.scrape)
    if getattr(args, "kubelet_socket", None):
        options["kubelet_socket"] = args.kubelet_socket
    if getattr(args, "kube_api", False):
        if not options.get("kubelet_socket"):
            raise ValueError("--kube-api adds pod metadata to --kubelet-socket's allocations: give both")
        options["kube_api"] = True
    if getattr(args, "team_label", None):
        options["team_label"] = args.team_label
    if getattr(args, "slurm", False):
        options["slurm"] = True
    return CollectorContext(
        node=args.node or default_node_name(),
        proc_root=args.proc_root,
        sys_root=args.sys_root,
        options=options,
    )


def collector_names(args: argparse.Namespace, ctx: CollectorContext) -> list[str]:
    """The collectors to run; raises ValueError when an option has no collector to take it."""
    load_collectors()  # an explicit --collector list skips enabled_collectors(), which loads them
    names = list(dict.fromkeys(args.collector)) if args.collector else enabled_collectors(ctx)
    for flag, option in SOURCE_FLAGS.items():
        if ctx.options.get(option) and not any(
            option in COLLECTORS[n].enabled_by for n in names if n in COLLECTORS
        ):
            takers = sorted(n for n, cls in COLLECTORS.items() if option in cls.enabled_by)
            hint = f"add --collector {takers[0]}" if takers else "no installed collector reads it"
            raise ValueError(f"{flag} is given but no chosen collector uses it ({hint})")
    return names


def run_agent(args: argparse.Namespace) -> int:
    """Run ``gpuscope agent`` from parsed arguments; the exit status (2: bad arguments or setup)."""
    try:
        if not (args.interval > 0):
            raise ValueError(f"--interval must be positive, got {args.interval}")
        ctx = context_from_args(args)
        names = collector_names(args, ctx)
        collectors = build_collectors(names, ctx)
    except ValueError as exc:
        print(f"gpuscope agent: {exc}", file=sys.stderr)
        return 2
    if not args.collector and not GPU_COLLECTORS & set(names):
        print(f"gpuscope agent: {NO_GPU_SOURCE}", file=sys.stderr)
    if args.once:
        try:
            result = collect_once_json(collectors, rate_window=max(0.0, args.rate_window))
        finally:
            for c in collectors:
                c.close()
        print(render_once(result, as_json=args.json))
        return 0
    endpoint = None
    if getattr(args, "metrics_listen", None):
        try:
            tls = None
            cert, key = getattr(args, "metrics_tls_cert", None), getattr(args, "metrics_tls_key", None)
            if cert or key:
                if not (cert and key):
                    raise ValueError("--metrics-tls-cert and --metrics-tls-key go together")
                tls = TlsSettings(cert, key)
            endpoint = MetricsEndpoint(*parse_listen(args.metrics_listen), tls=tls).start()
        except (ValueError, OSError) as exc:
            for c in collectors:
                c.close()
            print(f"gpuscope agent: {exc}", file=sys.stderr)
            return 2
        if not args.hub:
            return _serve_metrics_only(collectors, endpoint, args.interval)
    if not args.hub:
        print("gpuscope agent: --hub URL is required (or --once to print one round)", file=sys.stderr)
        for c in collectors:
            c.close()
        return 2
    try:
        agent = Agent(
            args.hub,
            ctx.node,
            collectors,
            interval=args.interval,
            token=args.token or os.environ.get("GPUSCOPE_TOKEN") or None,
            spool_dir=args.spool_dir,
            spool_max_bytes=int(args.spool_max_mb * 1024 * 1024),
            ca_file=getattr(args, "ca_file", None),
            send_spread=getattr(args, "send_spread", None),
        )
    except (ValueError, SpoolError) as exc:
        for c in collectors:
            c.close()
        if endpoint is not None:
            endpoint.close()
        print(f"gpuscope agent: {exc}", file=sys.stderr)
        return 2
    if endpoint is not None:
        agent.collectors = PublishingCollectorSet(collectors, endpoint, agent.counters)
    print(
        f"gpuscope agent: node {ctx.node}, collectors {', '.join(agent.collectors.names)}, "
        f"every {args.interval:g} s to {args.hub} (spool {agent.spool.dir})",
        file=sys.stderr,
    )
    try:
        stats = run_until_signalled(agent)
    except TokenRefused as exc:
        print(f"gpuscope agent: {token_refused_message(exc, agent.spool.dir)}", file=sys.stderr)
        return EXIT_TOKEN_REFUSED
    finally:
        if endpoint is not None:
            endpoint.close()
    log.info("agent stopped: %s", stats)
    return 0


def token_refused_message(exc: TokenRefused, spool: Path) -> str:
    """What the agent says, once, as it stops because the hub refused its token."""
    fix = (
        "check --token (or $GPUSCOPE_TOKEN) against the hub's auth.tokens; the agent needs a token "
        "with the 'ingest' scope"
    )
    return (
        f"{exc}. Stopping (exit status {EXIT_TOKEN_REFUSED}): nothing can be delivered until the hub "
        f"accepts a token; {fix}. What was collected stays in the spool ({spool}) and is sent by the "
        "next start the hub accepts."
    )


def _serve_metrics_only(collectors: list[Collector], endpoint: MetricsEndpoint, interval: float) -> int:
    """No hub: collect for the Prometheus endpoint alone until SIGINT/SIGTERM."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    cs = PublishingCollectorSet(collectors, endpoint)
    host, port = endpoint.address
    scheme = "https" if endpoint.tls else "http"
    print(f"gpuscope agent: serving {scheme}://{host}:{port}/metrics every {interval:g} s", file=sys.stderr)
    try:
        serve_only(cs, interval, stop)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        cs.close()
        endpoint.close()
    return 0


def render_once(result: dict[str, Any], *, as_json: bool) -> str:
    """JSON for machines, or one line per entity for a person."""
    if as_json:
        return orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    lines = [f"sources: {', '.join(result['sources'])}; {result['samples']} samples"]
    for entity, values in result["entities"].items():
        lines.append(entity)
        lines.extend(f"  {metric} = {value:g}" for metric, value in values.items())
    lines.extend(f"event {e['kind']} {e['labels']} {e['data']}" for e in result["events"])
    lines.extend(f"error {e['collector']}: {e['kind']}: {e['message']}" for e in result["errors"])
    return "\n".join(lines)
