"""The configuration reference: every section and key of the hub's YAML file, in one table.

``docs/configuration.md`` is :func:`render`'s output (``gpuscope config reference``), and
tests/test_config_reference.py keeps the three in step: the page must equal ``render()``, every
section's keys must equal the set its parser accepts, and every example must pass
``gpuscope config check``. A key added to a parser without a line here fails that test.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.store.memory_size import DEFAULT_CACHE_LIMIT, DEFAULT_MEMORY_LIMIT
from gpuscope.store.sealing import DEFAULT_SEAL_INTERVAL_S


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    default: str
    text: str


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    parser: str  # the module that parses it: where the rules live
    text: str
    keys: tuple[Key, ...]
    example: str  # YAML that `gpuscope config check` accepts


SECTIONS: tuple[Section, ...] = (
    Section(
        "listen",
        "gpuscope.config",
        "Address the hub serves on, `HOST:PORT` (`[::1]:PORT` for IPv6). Any address other than "
        "loopback is refused unless `auth` has a token. `gpuscope hub --listen` overrides it.",
        (),
        "listen: 127.0.0.1:7470\n",
    ),
    Section(
        "storage",
        "gpuscope.store.settings",
        "Where telemetry is kept: an embedded DuckDB file, or any Prometheus-compatible TSDB "
        "(remote-write in, PromQL out), with events, training records and alerts in a local DuckDB "
        "file or PostgreSQL.",
        (
            Key("backend", "duckdb", "`duckdb` or `prometheus`"),
            Key("path", "gpuscope.duckdb", "the DuckDB store (prometheus: the local meta store)"),
            Key("remote_write_url", "-", "prometheus: the remote-write URL"),
            Key("query_url", "-", "prometheus: base URL of the PromQL HTTP API"),
            Key("headers", "{}", "sent on writes and queries (e.g. `X-Scope-OrgID`)"),
            Key("bearer_token_file", "-", "file holding a bearer token for the TSDB"),
            Key("basic_auth", "-", "`{username, password_file}` for the TSDB"),
            Key("timeout_s", "10", "per request to the TSDB"),
            Key("retry_s", "30", "5xx and connection errors are retried this long, then 503"),
            Key("meta", "duckdb", "`duckdb` or `postgres`: home of events, training records, alerts"),
            Key("postgres_dsn", "-", "meta: postgres, shared by several hubs"),
            Key("flush_interval_s", "5", "duckdb: acknowledged batches move into the tables this often"),
            Key(
                "memory_limit",
                DEFAULT_MEMORY_LIMIT,
                "duckdb: the most its buffer pool and queries (a seal's sort) hold; RSS peaks "
                "this far above the working set",
            ),
            Key(
                "cache_limit",
                DEFAULT_CACHE_LIMIT,
                "duckdb: cached table blocks DuckDB's buffer pool keeps after each minute's upkeep "
                "(it would keep every block it wrote or read up to `memory_limit`); the rest is "
                "read back from disk when needed",
            ),
            Key(
                "seal_interval_s",
                f"{DEFAULT_SEAL_INTERVAL_S:g}",
                "duckdb: raw rows move from the hot table into a Parquet piece this often (whole "
                "minutes dividing an hour, or whole hours); each closed hour's pieces become one file",
            ),
        ),
        "storage: {backend: duckdb, path: /var/lib/gpuscope/gpuscope.duckdb}\n",
    ),
    Section(
        "auth",
        "gpuscope.web.auth",
        "Scoped tokens (`ingest`, `read`, `admin`) kept as SHA-256 digests, per-token rate limits "
        "and the audit log of admin writes. `GPUSCOPE_TOKEN` adds a plain token with every scope.",
        (
            Key("tokens", "[]", "`{name, scopes, sha256}` from `gpuscope token create`, or a plain string"),
            Key("require_read_token", "false", "on loopback reads are open unless this is true"),
            Key("rate_limits", "{}", "`{ingest|read|admin|anonymous: {rate, burst}, tokens: {NAME: ...}}`"),
            Key("audit_log", "<store>.audit.jsonl", "append-only JSON lines of every admin write"),
        ),
        "auth:\n"
        "  tokens:\n"
        "    - {name: agents, scopes: [ingest], sha256: "
        '"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}\n'
        "  rate_limits: {ingest: {rate: 200, burst: 400}}\n",
    ),
    Section(
        "tls",
        "gpuscope.tls",
        "Serve HTTPS. With `client_ca_file`, clients must present a certificate signed by it.",
        (
            Key("cert_file", "-", "PEM certificate chain"),
            Key("key_file", "-", "PEM private key"),
            Key("client_ca_file", "-", "PEM CA bundle; makes client certificates required"),
        ),
        "",
    ),
    Section(
        "pricing",
        "gpuscope.config",
        "What a GPU-hour costs: alerts and incidents are ranked by the cost of delay it gives.",
        (Key("price_per_gpu_hour", "2.5", "currency units per GPU-hour"),),
        "pricing: {price_per_gpu_hour: 2.5}\n",
    ),
    Section(
        "limits",
        "gpuscope.config",
        "Bounds on what agents and SDKs may send, and on the hub process's malloc arenas.",
        (
            Key("max_body_bytes", "67108864", "largest request body; a larger one is refused (413)"),
            Key("max_entities", "100000", "checked as a number, not enforced yet by this version"),
            Key("max_metrics", "512", "checked as a number, not enforced yet by this version"),
            Key(
                "malloc_arenas",
                "2",
                "glibc malloc arenas of the hub (0: glibc's 8 per core); each keeps the memory freed in it",
            ),
        ),
        "limits: {max_body_bytes: 67108864, max_entities: 100000, max_metrics: 512}\n",
    ),
    Section(
        "retention",
        "gpuscope.config",
        "How long raw samples are kept; older batches are refused as too old.",
        (Key("raw_seconds", "604800", "seconds of raw samples (7 days)"),),
        "retention: {raw_seconds: 604800}\n",
    ),
    Section(
        "detection",
        "gpuscope.config",
        "Detector start-up: stored history replayed to the detectors when a hub starts or takes over; "
        "how long an ended job's state is kept.",
        (
            Key("warmup_s", "900", "seconds of history replayed"),
            Key("finished_job_retention_s", "3600", "seconds a job's state is kept after it ended"),
        ),
        "detection: {warmup_s: 900, finished_job_retention_s: 3600}\n",
    ),
    Section(
        "hub",
        "gpuscope.config",
        "The hub's processes. With `ingest_workers: N` (1 or more), N processes of their own serve "
        "`POST /api/v1/ingest` on the hub's port (HTTP parsing, decoding, validation, the durable "
        "log and the acknowledgement), each acknowledging a batch once it is synced in its own log "
        "beside the store (`<store>.ingest/<n>/`), which the hub reads into the store; the hub "
        "process keeps the store's commit, detection, alerting and every other route, handed the "
        "connections that ask for them. Needs the DuckDB store, and is refused with `tls` or "
        "`cluster`. A worker that dies is started again (`ingest_worker_restarts`). Rate limits "
        "are counted per process. Measured: docs/scaling.md.",
        (
            Key(
                "ingest_workers",
                "0",
                "ingest worker processes, 0 to 64; 0: the hub's own process serves ingest",
            ),
        ),
        "hub: {ingest_workers: 2}\n",
    ),
    Section(
        "receivers",
        "gpuscope.alert.settings",
        "Where notifications go: a list of `{name, KIND: {...}}` with exactly one kind: "
        "`webhook: {url, headers}`, `slack: {url, channel}`, `pagerduty: {routing_key, url}`, "
        "`alertmanager: {url}`. URLs and keys are secrets: they never appear in logs or errors.",
        (),
        "receivers:\n"
        '  - {name: oncall, pagerduty: {routing_key: "R0UT1NGKEY"}}\n'
        '  - {name: ml-team, slack: {url: "https://hooks.slack.example/T000/B000/XXX", channel: "#ml"}}\n'
        '  - {name: am, alertmanager: {url: "http://127.0.0.1:9093"}}\n',
    ),
    Section(
        "routes",
        "gpuscope.alert.routing",
        "The route tree, with Alertmanager's semantics: the first matching route takes an alert "
        "(unless `continue: true`); children refine their parent and inherit its receiver and timings. "
        "Alerts carry `alertname` (= `rule`), `severity` (= `tier`: P1, P2, P3), `owner` (platform, "
        "model, serving, product), `incident` and their entity's labels (`node`, `gpu`, `job`, `service`). "
        '`group_by: ["..."]` groups by every label. An alert that reaches a graver tier (P2 → P1) stays '
        "one alert: a group that told it fires tells the graver tier with its next changes "
        "(`group_interval`); where a route groups by the tier (`...`, `severity` or `tier`), the alert "
        "moves to its new tier's group, which alone tells the graver tier and later the resolution.",
        (
            Key("receiver", "parent's", "a name from `receivers`"),
            Key("match", "{}", "label equality, e.g. `{severity: P1}`"),
            Key("match_re", "{}", "label regular expressions"),
            Key("matchers", "[]", "`NAME=V`, `NAME!=V`, `NAME=~RE`, `NAME!~RE`"),
            Key("group_by", "[incident]", "labels that make one notification group"),
            Key("group_wait", "0s", "wait before the first notification of a group"),
            Key("group_interval", "30s", "wait before notifying a group's changes"),
            Key("repeat_interval", "4h", "re-send a still-firing group this often"),
            Key("continue", "false", "go on to the next sibling after a match"),
            Key("routes", "[]", "child routes"),
        ),
        "receivers:\n"
        '  - {name: oncall, pagerduty: {routing_key: "R0UT1NGKEY"}}\n'
        '  - {name: ml-team, webhook: {url: "http://127.0.0.1:9000/hook"}}\n'
        "routes:\n"
        "  - {receiver: oncall, match: {severity: P1}, repeat_interval: 1h}\n"
        "  - receiver: ml-team\n"
        "    group_by: [incident]\n"
        "    routes:\n"
        "      - {matchers: ['rule=~\"training_.*\"'], group_wait: 30s}\n",
    ),
    Section(
        "alerting",
        "gpuscope.alert.settings",
        "How alerts are held, muted and re-sent.",
        (
            Key("state_path", "<store>.alerts.sqlite", "outbox, silences, acknowledgements, history"),
            Key("external_url", '""', "the hub's URL as people reach it (links in notifications)"),
            Key("pending", "{}", "per-rule pending time, `{rule: duration}` (hard faults cannot wait)"),
            Key("flap", "{threshold: 4, window: 15m}", "an alert that fires this often is held as flapping"),
            Key("silences", "[]", "`{matchers, duration | starts_at/ends_at, comment}`"),
            Key(
                "maintenance",
                "[]",
                "`{name, matchers, weekdays, start, duration, timezone}` or `{name, matchers, starts_at, "
                "ends_at}`: matching alerts fire but notify nobody while the window is open",
            ),
            Key("escalation", "[]", "`{after, receiver, matchers}`: unacknowledged alerts go further"),
            Key("outbox", "{base_backoff: 1s, max_backoff: 30s, max_age: 1d}", "retries of notifications"),
        ),
        "alerting:\n"
        "  pending: {loss_plateau: 10m}\n"
        "  maintenance: [{name: weekly, matchers: {node: node-3}, weekdays: [sat], start: '02:00', "
        "duration: 2h}]\n"
        "  silences: [{matchers: ['job=experiment-7'], duration: 8h, comment: known bad run}]\n",
    ),
    Section(
        "slos",
        "gpuscope.quality.slo",
        "Per-service objectives; their error budgets' burn rates raise alerts.",
        (
            Key("service", "-", "the service name"),
            Key("availability", "-", "share of requests that must succeed, e.g. 0.999"),
            Key("latency", "-", "`{threshold_seconds, objective}`: share of requests faster than it"),
        ),
        "slos:\n"
        "  - {service: chat, availability: 0.999, latency: {threshold_seconds: 0.5, objective: 0.99}}\n",
    ),
    Section(
        "cluster",
        "gpuscope.cluster.config",
        "Several hubs sharing the work by shards, with membership and alert state in PostgreSQL.",
        (
            Key("postgres_dsn", "-", "required (or `state.postgres_dsn`)"),
            Key("hub_id", "hostname:port", "this hub's name in the cluster"),
            Key("advertise_url", "http://<listen>", "how peers reach this hub"),
            Key("shards", "256", "fixed for the life of a cluster"),
            Key("lease_s", "5", "a member whose lease is older is dead"),
            Key("peer_token", "-", "hubs forwarding batches to each other (16 characters or more)"),
            Key("forward_queue", "1000", "batches queued per peer before drops are counted"),
        ),
        "",
    ),
    Section(
        "state",
        "gpuscope.cluster.config",
        "Shared state of sharded hubs: `state.postgres_dsn` means the same as `cluster.postgres_dsn`.",
        (Key("postgres_dsn", "-", "a postgresql:// URL"),),
        "",
    ),
)


AGENT_TEXT = (
    "`gpuscope agent` reads no file: its settings are options (`gpuscope agent --help`). Rounds are "
    "collected on multiples of `--interval` (default 1 s) on the node's clock, so every node's "
    "samples line up; each round is sent at that instant plus an offset of the node's own in "
    "`[0, --send-spread)`, a hash of its name (the same on every start), so that a fleet's agents do "
    "not all post on one instant. It defaults to half the interval, `0` sends at the instant, and it "
    "must stay below 0.8 x the interval, by when a round's sends end. `--spool-dir` and "
    "`--spool-max-mb` (default 256) bound what waits while the hub is "
    "away; `--token` (or `$GPUSCOPE_TOKEN`) is a token with the `ingest` scope."
)


def render() -> str:
    """``docs/configuration.md``."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `gpuscope config reference` from src/gpuscope/config_reference.py: "
        "do not edit -->",
        "",
        "The hub reads one YAML file (`gpuscope hub --config FILE` or `$GPUSCOPE_CONFIG`). Every "
        "section is optional. An unknown key, in any section, is refused with its name and the keys "
        "that section knows, so a typo never silently falls back to a default. "
        "`gpuscope config check FILE` parses every section as the hub would, without opening anything.",
        "",
    ]
    for s in SECTIONS:
        out += [f"## `{s.name}`", "", s.text, "", f"Parsed by `{s.parser}`.", ""]
        if s.keys:
            out += ["| key | default | meaning |", "|---|---|---|"]
            out += [f"| `{k.name}` | `{k.default}` | {k.text} |" for k in s.keys]
            out.append("")
        if s.example:
            out += ["```yaml", s.example.rstrip("\n"), "```", ""]
    out += ["## The agent", "", AGENT_TEXT, ""]
    return "\n".join(out)
