"""Property tests of every parser gpuscope owns: any input gives a result or the parser's documented
error (naming the place), never another exception; writers and readers round-trip.

Inputs are counted in :data:`fuzz.budget.TRIED` for bench/bench_fuzz.py, which runs these tests
with many more examples.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.budget import TRIED
from gpuscope.agent.metrics_endpoint import render_exposition
from gpuscope.collect.base import CollectorError
from gpuscope.collect.dcgm import KNOWN, DcgmCollector, map_samples
from gpuscope.collect.infiniband import COUNTERS, HW_COUNTERS, InfinibandCollector, read_ports
from gpuscope.collect.kmsg import normalise_pci, parse_xid_line
from gpuscope.collect.procfs import (
    ProcFormatError,
    parse_loadavg,
    parse_meminfo,
    parse_net_dev,
    parse_snmp,
    parse_stat_cpu,
)
from gpuscope.collect.promtext import ExpositionError, Sample, parse_exposition
from gpuscope.collect.serving import EngineScraper, split_target
from gpuscope.config import ConfigError, load_config
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.ingest.payload import PayloadError, batch_to_json, decode_json, parse_batch
from gpuscope.model import Batch, Event, Frame, TrainingRecord
from gpuscope.sdk.env import PlacementError, detect_placement
from gpuscope.sim.scenario import ScenarioError, parse_scenario

# -- shared strategies -----------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,15}", fullmatch=True)
LABEL_VALUES = st.text(max_size=20)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
#: scalars as YAML or exposition text: the awkward ones each parser must refuse by name
AWKWARD = st.sampled_from(
    [
        "0b_",
        "0x",
        "0o",
        "1:_",
        "!!int x",
        "!!float x",
        "!!int 1.5",
        "1e400",
        "-1e400",
        ".nan",
        ".inf",
        "9" * 5000,
        "1_000",
        "²",
        "١٢",
        "0x1F",
        "~",
        "''",
        "[]",
        "{}",
        "[[[[[[[[[[]]]]]]]]]]",
        "&a x",
        "*a",
        "yes",
        "NaN",
        "+Inf",
        "-0",
        "1e-400",
        "true",
        "2.5",
        "7",
        "-3",
        "node-0",
        "'7'",
    ]
)
SCALAR_TEXT = st.one_of(
    AWKWARD,
    st.integers(-(10**30), 10**30).map(str),
    st.floats().map(repr),
    st.text(alphabet="0123456789.-+eE_:xob ", max_size=12),
)
JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64), st.floats(), st.text(max_size=12)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def _prom_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _prom_labels(labels: dict[str, str]) -> str:
    esc = {k: v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}" if esc else ""


# -- Prometheus text (collect/promtext.py, agent/metrics_endpoint.py) -------------------------------

PROM_TEXT = st.text(alphabet='ab_:{}="\\, \n\r\t#0123456789.eE+-InfNa\x0b\x1c\u2028', max_size=200)


@given(st.one_of(st.text(max_size=200), PROM_TEXT))
def test_exposition_parses_or_names_the_line(text: str) -> None:
    TRIED["promtext"] += 1
    try:
        samples = parse_exposition(text)
    except ExpositionError as exc:
        assert 1 <= exc.line_no <= text.count("\n") + 1
        return
    assert all(isinstance(s, Sample) and isinstance(s.value, float) for s in samples)


FRAMES = st.lists(
    st.tuples(
        st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,15}", fullmatch=True),
        st.lists(st.dictionaries(NAMES, LABEL_VALUES, max_size=3), min_size=1, max_size=4, unique_by=str),
        st.floats(allow_nan=False),
    ),
    max_size=5,
    unique_by=lambda t: t[0],
)


@given(FRAMES)
def test_exposition_round_trips_through_the_agent_renderer(spec: list[Any]) -> None:
    TRIED["promtext"] += 1
    frames, expected = [], {}
    for metric, entities, value in spec:
        entities = list({tuple(sorted(e.items())): e for e in entities}.values())
        frames.append(Frame(1.0, [metric], entities, np.full((len(entities), 1), value)))
        for e in entities:
            expected[(metric, tuple(sorted(e.items())))] = value
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in parse_exposition(render_exposition(frames))
    }
    assert got == expected


# -- kernel log XIDs (collect/kmsg.py) --------------------------------------------------------------


@given(st.text(max_size=200) | st.builds(lambda s: f"NVRM: Xid (PCI:{s}", st.text(max_size=60)))
@example("NVRM: Xid (PCI:0000:9b:00): " + "9" * 5000 + ", pid=1, name=x, boom")
@example("NVRM: Xid (PCI:0000:9b:00): ١٢, pid=1")
def test_any_kernel_log_line_is_an_xid_or_nothing(line: str) -> None:
    TRIED["kmsg"] += 1
    xid = parse_xid_line(line)
    if xid is not None:
        assert 0 <= xid.code < 10**9 and normalise_pci(xid.pci) == xid.pci


@given(
    st.from_regex(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(\.[0-7])?", fullmatch=True),
    st.integers(0, 999),
    st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.from_regex(r"[a-z]{1,8}", fullmatch=True))),
    st.from_regex(r"\[ *[0-9]{1,6}\.[0-9]{6}\] ", fullmatch=True),
)
def test_xid_lines_as_the_driver_prints_them(pci: str, code: int, proc: Any, prefix: str) -> None:
    TRIED["kmsg"] += 1
    tail = f", pid={proc[0]}, name={proc[1]}, Ch 00000008" if proc else ", Ch 00000008"
    xid = parse_xid_line(f"{prefix}NVRM: Xid (PCI:{pci}): {code}{tail}")
    assert xid is not None and xid.code == code and xid.pci == normalise_pci(pci)
    assert xid.pid == (str(proc[0]) if proc else None)


# -- scenario files (sim/scenario.py) ---------------------------------------------------------------

SCENARIO_TEMPLATE = """\
duration: {0}
interval: {1}
seed: {2}
cluster: {{nodes: {3}, gpus_per_node: {4}, price_per_gpu_hour: {5}}}
jobs:
  - {{name: {6}, kind: training, nodes: [node-0], step_time: {7}, steps: {8}, start: {9}}}
  - {{name: chat, kind: inference, nodes: [node-1], gpus: [{10}], rps: {11}}}
faults:
  - {{at: {12}, kind: xid, target: {{node: node-0, gpu: {13}}}, params: {{code: {14}}}, duration: {15}}}
  - {{at: 5, kind: straggler, target: {{job: {6}, rank: {16}}}, params: {{slowdown: {17}}}}}
"""
VALID_SLOTS = [
    "60",
    "1",
    "7",
    "2",
    "2",
    "2.5",
    "train",
    "1.0",
    "10",
    "0",
    "0",
    "5",
    "10",
    "1",
    "79",
    "5",
    "1",
    "1.3",
]


def _check_scenario(text: str) -> None:
    try:
        scenario = parse_scenario(text, name="fuzz.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.yaml")
        assert exc.line is None or 1 <= exc.line <= text.count("\n") + 2, exc
        assert exc.message
        return
    assert scenario.duration > 0 and scenario.cluster.nodes >= 1


@given(st.lists(st.tuples(st.integers(0, len(VALID_SLOTS) - 1), SCALAR_TEXT), max_size=4))
def test_scenario_fields_take_any_scalar(changes: list[tuple[int, str]]) -> None:
    TRIED["scenario"] += 1
    slots = list(VALID_SLOTS)
    for i, text in changes:
        slots[i] = text
    _check_scenario(SCENARIO_TEMPLATE.format(*slots))


@given(st.text(max_size=300) | st.builds(yaml.safe_dump, JSON))
@example("[" * 1200 + "]" * 1200)
@example("duration: 1\ncluster: {nodes: 1}\njobs: " + "[" * 1200)
@example("a: &x [*x]")
def test_any_text_is_a_scenario_or_a_scenario_error(text: str) -> None:
    TRIED["scenario"] += 1
    _check_scenario(text)


def test_the_valid_template_is_valid() -> None:
    assert parse_scenario(SCENARIO_TEMPLATE.format(*VALID_SLOTS)).faults[0].params["code"] == 79


# -- hub config (config.py) -------------------------------------------------------------------------

CONFIG_TEMPLATE = """\
listen: {0}
storage: {{backend: duckdb, path: {1}}}
auth: {{tokens: [{2}]}}
pricing: {{price_per_gpu_hour: {3}}}
limits: {{max_body_bytes: {4}, max_entities: {5}, max_metrics: {6}}}
retention: {{raw_seconds: {7}}}
"""
CONFIG_SLOTS = ["127.0.0.1:7470", "x.duckdb", "a-token-of-sixteen-chars", "2.5", "1000", "10", "10", "60"]
CONFIG_DIR = Path(tempfile.mkdtemp(prefix="gpuscope-fuzz-config-"))


def _check_config(text: str) -> None:
    path = CONFIG_DIR / "gpuscope.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        assert str(exc)
        return
    assert 0 < cfg.port < 65536 and math.isfinite(cfg.price_per_gpu_hour) and cfg.max_body_bytes >= 0


@given(st.lists(st.tuples(st.integers(0, len(CONFIG_SLOTS) - 1), SCALAR_TEXT), max_size=3))
def test_config_values_take_any_scalar(changes: list[tuple[int, str]]) -> None:
    TRIED["config"] += 1
    slots = list(CONFIG_SLOTS)
    for i, text in changes:
        slots[i] = text
    _check_config(CONFIG_TEMPLATE.format(*slots))


@given(
    st.text(max_size=200)
    | st.builds(yaml.safe_dump, JSON)
    | st.binary(max_size=50).map(lambda b: b.decode("latin-1"))
)
@example("{1: a, b: c}")
@example("\udcff: 1")
def test_any_config_file_loads_or_names_the_key(text: str) -> None:
    TRIED["config"] += 1
    _check_config(text)


# -- procfs (collect/procfs.py) ---------------------------------------------------------------------

PROC_TEXT = st.text(
    alphabet="TcpUdp: OutSegsRetrans|cpu MemTotalAvailableFree eth0 0123456789-\n", max_size=300
)


@given(st.text(max_size=200) | PROC_TEXT)
@example("cpu 1 2 3 " + "9" * 5000)
@example("inf")
@example("MemTotal: 1e5 kB")
def test_procfs_parsers_return_numbers_or_name_the_file(text: str) -> None:
    TRIED["procfs"] += 5
    for parse in (parse_snmp, parse_stat_cpu, parse_loadavg, parse_meminfo, parse_net_dev):
        try:
            result: Any = parse(text)
        except ProcFormatError as exc:
            assert exc.path and str(exc).startswith(exc.path)
            continue
        if parse is parse_loadavg:
            assert math.isfinite(result) and result >= 0


# -- sysfs InfiniBand (collect/infiniband.py) -------------------------------------------------------

SYSFS_VALUE = st.one_of(
    SCALAR_TEXT,
    st.text(max_size=20),
    st.sampled_from(["4: ACTIVE", "1: DOWN", "100 Gb/sec (4X EDR)", "1.2.3 Gb/sec", ". Gb/sec"]),
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "state",
                "rate",
                "link_layer",
                *(f"counters/{c}" for c in COUNTERS),
                *(f"hw_counters/{c}" for c in HW_COUNTERS),
            ]
        ),
        SYSFS_VALUE,
        max_size=8,
    )
)
def test_infiniband_ports_read_any_file_contents(files: dict[str, str]) -> None:
    TRIED["sysfs_infiniband"] += 1
    with tempfile.TemporaryDirectory() as root:
        port = Path(root, "class", "infiniband", "mlx5_0", "ports", "1")
        for rel, text in files.items():
            (port / rel).parent.mkdir(parents=True, exist_ok=True)
            (port / rel).write_bytes(text.encode("utf-8", "surrogatepass"))
        port.mkdir(parents=True, exist_ok=True)
        errors: list[CollectorError] = []
        (read,) = read_ports(root, errors)
        assert all(math.isfinite(v) for v in read.values.values()), read.values
        assert all(isinstance(e, CollectorError) for e in errors)
        collector = InfinibandCollector("node-0", sys_root=root)
        for now in (1.0, 2.0):
            out = collector.collect(now)
            assert all(not np.isinf(f.values).any() for f in out.frames)


# -- dcgm-exporter (collect/dcgm.py) ----------------------------------------------------------------

DCGM_SAMPLE = st.tuples(
    st.sampled_from([*sorted(KNOWN), "DCGM_FI_UNKNOWN", "other_metric"]),
    st.fixed_dictionaries(
        {},
        optional={
            "gpu": st.sampled_from(["0", "1", ""]),
            "UUID": st.sampled_from(["GPU-a", ""]),
            "pod": LABEL_VALUES,
            "hpc_job": st.sampled_from(["1", "2"]),
            "xid": st.sampled_from(["79", "x", "13"]),
            "pci_bus_id": st.sampled_from(["00000000:9B:00.0", "bad"]),
        },
    ),
    FLOATS,
)


@given(st.lists(DCGM_SAMPLE, max_size=12), st.lists(DCGM_SAMPLE, max_size=12))
def test_dcgm_exporter_output_maps_or_is_refused(first: list[Any], second: list[Any]) -> None:
    TRIED["dcgm"] += 1
    texts = [
        "\n".join(f"{n}{_prom_labels(lbl)} {_prom_value(v)}" for n, lbl, v in s) for s in (first, second)
    ]
    reading = map_samples(parse_exposition(texts[0]), "node-0")
    assert reading.unplaced >= 0 and reading.unmapped >= 0
    collector = DcgmCollector("node-0", fetch=iter(texts).__next__)
    for now in (1.0, 2.0):
        out = collector.collect(now)
        assert all(isinstance(e.data["code"], int) for e in out.events)


# -- serving engines (collect/serving*.py) ----------------------------------------------------------

SERVING_NAMES = [
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:cache_config_info",
    "tgi_request_duration_bucket",
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_summary_us",
    "nv_inference_request_summary_us_count",
]
SERVING_SAMPLE = st.tuples(
    st.sampled_from(SERVING_NAMES),
    st.fixed_dictionaries(
        {},
        optional={
            "model_name": st.sampled_from(["m", "n"]),
            "model": st.sampled_from(["m", ""]),
            "le": st.sampled_from(["0.1", "1", "+Inf", "abc", "NaN", "-Inf", "1e400"]),
            "quantile": st.sampled_from(["0.5", "0.99", "x", "NaN"]),
            "finished_reason": st.sampled_from(["stop", "abort"]),
            "num_gpu_blocks": st.sampled_from(["100", "²", "9" * 400]),
        },
    ),
    FLOATS,
)


@given(st.lists(SERVING_SAMPLE, max_size=12), st.lists(SERVING_SAMPLE, max_size=12), SCALAR_TEXT)
def test_serving_rows_are_finite_or_refused(first: list[Any], second: list[Any], block: str) -> None:
    TRIED["serving"] += 1
    scraper = EngineScraper("http://127.0.0.1:8000/metrics", "node-0", {"kv_block_bytes": block})
    for now, samples in ((1.0, first), (2.0, second)):
        text = "\n".join(f"{n}{_prom_labels(lbl)} {_prom_value(v)}" for n, lbl, v in samples)
        try:
            rows = scraper.rows(text, now)
        except (ExpositionError, ValueError):  # documented: reported as a scrape error
            continue
        assert all(math.isfinite(v) for _, values in rows for v in values.values())


@given(st.text(max_size=80) | st.builds(lambda f: f"http://h:8000/metrics#{f}", st.text(max_size=40)))
def test_scrape_targets_parse_or_raise_value_error(url: str) -> None:
    TRIED["serving"] += 1
    try:
        target, options = split_target(url)
    except ValueError as exc:
        assert str(exc)
        return
    assert target.startswith("http") and "#" not in target
    assert options.get("kv_block_bytes", "0").isascii()


# -- ingest payload (ingest/payload.py) -------------------------------------------------------------


def _check_batch(obj: Any) -> None:
    try:
        batch = parse_batch(obj)
    except PayloadError as exc:
        assert exc.field and exc.message
        return
    assert isinstance(batch, Batch) and batch.source


BATCHISH = st.fixed_dictionaries(
    {"source": st.one_of(st.text(max_size=5), JSON)},
    optional={
        "frames": st.lists(
            st.fixed_dictionaries(
                {"ts": JSON_LEAVES, "metrics": st.lists(NAMES | JSON_LEAVES, max_size=3)},
                optional={
                    "entities": st.lists(
                        st.dictionaries(NAMES | st.text(max_size=3), JSON_LEAVES, max_size=2), max_size=3
                    ),
                    "values": JSON,
                },
            ),
            max_size=3,
        ),
        "events": st.lists(
            st.fixed_dictionaries(
                {"ts": JSON_LEAVES, "kind": NAMES | JSON_LEAVES}, optional={"labels": JSON, "data": JSON}
            ),
            max_size=3,
        ),
        "training": st.lists(
            st.fixed_dictionaries(
                {"ts": JSON_LEAVES, "job": JSON_LEAVES, "rank": JSON_LEAVES, "step": JSON_LEAVES},
                optional={
                    "metrics": st.dictionaries(NAMES | st.text(max_size=3), JSON_LEAVES, max_size=3),
                    "labels": JSON,
                },
            ),
            max_size=3,
        ),
        "batch_id": JSON_LEAVES,
        "": JSON,
    },
)


@given(JSON | BATCHISH)
@example({"source": "a", "frames": [{"ts": 1, "metrics": ["m"], "entities": [{}], "values": [[10**400]]}]})
@example({"source": "a", "training": [{"ts": 10**400, "job": "j", "rank": 0, "step": 0}]})
@example(
    {"source": "a", "training": [{"ts": 1, "job": "j", "rank": 0, "step": 0, "metrics": {"l": 10**400}}]}
)
@example({"source": "a", "events": [{"ts": 1, "kind": "k", "data": {"x": 2**64}}]})
@example({"source": "a", "events": [{"ts": 1, "kind": "k", "data": {1: 2}}]})
@example({"source": "a", "frames": [{"ts": 1, "metrics": ["m\n"], "entities": [], "values": []}]})
def test_any_json_is_a_batch_or_names_the_field(obj: Any) -> None:
    TRIED["ingest_payload"] += 1
    _check_batch(obj)


@given(
    st.binary(max_size=200)
    | JSON.map(lambda v: orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY) if _dumpable(v) else b"{")
)
def test_any_bytes_decode_or_name_the_body(body: bytes) -> None:
    TRIED["ingest_payload"] += 1
    try:
        obj = decode_json(body)
    except PayloadError as exc:
        assert exc.field == "body"
        return
    _check_batch(obj)


def _dumpable(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


FINITE = st.floats(allow_nan=False, allow_infinity=False)
LABELS = st.dictionaries(NAMES, st.text(min_size=0, max_size=10), max_size=3)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    frames = []
    for _ in range(draw(st.integers(0, 2))):
        metrics = draw(st.lists(NAMES, max_size=4, unique=True))
        entities = draw(st.lists(LABELS, max_size=3))
        cells = draw(
            st.lists(
                FINITE | st.just(math.nan),
                min_size=len(metrics) * len(entities),
                max_size=len(metrics) * len(entities),
            )
        )
        values = np.array(cells, dtype=np.float64).reshape(len(entities), len(metrics))
        frames.append(Frame(draw(st.floats(0, 2e9)), metrics, entities, values))
    events = [
        Event(
            draw(st.floats(0, 2e9)),
            draw(NAMES),
            draw(LABELS),
            draw(st.dictionaries(st.text(max_size=5), JSON_LEAVES.filter(_dumpable), max_size=3)),
        )
        for _ in range(draw(st.integers(0, 2)))
    ]
    training = [
        TrainingRecord(
            draw(st.floats(0, 2e9)),
            draw(st.text(min_size=1, max_size=10)),
            draw(st.integers(0, 2**31)),
            draw(st.integers(0, 2**53)),
            draw(st.dictionaries(NAMES, FINITE | st.just(math.nan), max_size=3)),
            draw(LABELS),
        )
        for _ in range(draw(st.integers(0, 2)))
    ]
    return Batch(
        draw(st.text(min_size=1, max_size=10)),
        frames,
        events,
        training,
        draw(st.none() | st.text(min_size=1, max_size=10)),
    )


@given(batches())
def test_batch_json_round_trips(batch: Batch) -> None:
    TRIED["ingest_payload"] += 1
    wire = orjson.loads(orjson.dumps(batch_to_json(batch)))
    again = parse_batch(wire)
    assert orjson.dumps(batch_to_json(again)) == orjson.dumps(batch_to_json(batch))


# -- binary frames (ingest/frame.py) ----------------------------------------------------------------


@given(batches())
def test_batch_frame_round_trips_like_json(batch: Batch) -> None:
    TRIED["ingest_frame"] += 1
    via_json = parse_batch(orjson.loads(orjson.dumps(batch_to_json(batch))))
    via_frame = decode_frame(encode_frame(batch))
    assert orjson.dumps(batch_to_json(via_frame)) == orjson.dumps(batch_to_json(via_json))


def _check_frame(body: bytes) -> None:
    try:
        batch = decode_frame(body)
    except PayloadError as exc:
        assert exc.field and exc.message
        return
    assert isinstance(batch, Batch) and batch.source


@given(batches(), st.data())
def test_truncated_or_damaged_frames_decode_or_name_the_field(batch: Batch, data: st.DataObject) -> None:
    TRIED["ingest_frame"] += 3
    body = encode_frame(batch)
    cut = data.draw(st.integers(0, len(body)))
    _check_frame(body[:cut])
    at = data.draw(st.integers(0, len(body) - 1))
    _check_frame(body[:at] + bytes([data.draw(st.integers(0, 255))]) + body[at + 1 :])
    _check_frame(body[:at] + data.draw(st.binary(max_size=12)) + body[at:])


@given(st.binary(max_size=200).map(lambda b: b"\x89GSF\x01\x00\x00\x00" + b))
def test_any_bytes_after_the_frame_header_decode_or_name_the_field(body: bytes) -> None:
    TRIED["ingest_frame"] += 1
    _check_frame(body)


# -- SDK payloads (sdk/shipper.py, sdk/env.py) ------------------------------------------------------


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(FLOATS, st.integers(-(10**400), 10**400), st.text(max_size=4), st.booleans(), st.none()),
        max_size=5,
    )
)
def test_what_the_sdk_ships_the_hub_accepts(metrics: dict[str, Any]) -> None:
    TRIED["sdk_payload"] += 1
    from gpuscope.counters import Counters
    from gpuscope.sdk.shipper import clean_metrics

    counters = Counters()
    clean = clean_metrics(metrics, counters)
    record = TrainingRecord(1.0, "job", 0, 1, clean, {"node": "n", "gpu": "0"})
    wire = orjson.loads(orjson.dumps(batch_to_json(Batch("sdk:job:0", training=[record]))))
    (parsed,) = parse_batch(wire).training
    assert set(parsed.metrics) == set(clean)
    assert counters.snapshot().get("sdk_invalid_metrics", 0) == len(metrics) - len(clean)


ENV_KEYS = [
    "GPUSCOPE_JOB",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
    "GPUSCOPE_NODE",
    "SLURM_STEP_GPUS",
    "NVIDIA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "PET_NNODES",
]


@given(st.dictionaries(st.sampled_from(ENV_KEYS), SCALAR_TEXT | st.text(max_size=8), max_size=6))
def test_any_launcher_environment_is_a_placement_or_a_placement_error(env: dict[str, str]) -> None:
    TRIED["sdk_env"] += 1
    try:
        p = detect_placement(env, uuid_index=dict)
    except PlacementError as exc:
        assert str(exc)
        return
    assert p.job and 0 <= p.rank < p.world_size and p.local_rank >= 0 and p.gpu != ""


def teardown_module() -> None:
    for f in CONFIG_DIR.iterdir():
        f.unlink()
    os.rmdir(CONFIG_DIR)
