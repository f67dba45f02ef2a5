"""Scenario parsing: the DESIGN §4 example, defaults, and an exact message for every kind of mistake."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuscope.sim import (
    FAULT_KINDS,
    ScenarioError,
    builtin_names,
    builtin_scenario,
    load_scenario,
    parse_scenario,
)
from gpuscope.sim.faults import EFFECTS

FIXTURES = Path(__file__).parent / "fixtures"


def test_design_example_is_accepted_verbatim() -> None:
    sc = load_scenario(FIXTURES / "design_example.yaml")
    assert (sc.name, sc.seed, sc.duration, sc.interval) == ("design_example", 7, 3600.0, 1.0)
    assert sc.cluster.nodes == 4 and sc.cluster.gpus_per_node == 8
    assert sc.cluster.gpu_model == "H100-SXM5-80GB" and sc.cluster.price_per_gpu_hour == 2.5
    train, chat = sc.jobs
    assert train.kind == "training" and train.nodes == ("node-0", "node-1", "node-2")
    assert train.step_time == 1.2 and train.checkpoint_every == 300
    assert train.world_size == 24 and (train.start, train.end) == (0.0, 3600.0)
    assert chat.kind == "inference" and chat.gpus == (0, 1, 2, 3)
    assert (chat.rps, chat.model, chat.version) == (40, "chat", "v7")
    xid, straggler = sc.faults
    assert (
        xid.kind == "xid"
        and xid.target == {"node": "node-1", "gpu": 3}
        and (xid.node, xid.gpu) == ("node-1", 3)
    )
    assert xid.params == {"code": 79} and xid.duration is None and xid.end == math.inf
    assert straggler.target == {"job": "llm-pretrain", "rank": 5} and straggler.rank == 5
    assert straggler.params == {"slowdown": 1.3} and straggler.end == 1200.0
    assert xid.line == 9 and straggler.line == 10


def test_placement_follows_the_contract() -> None:
    sc = load_scenario(FIXTURES / "design_example.yaml")
    train = sc.job("llm-pretrain")
    assert train.placement[0] == (0, "node-0", 0)
    assert train.placement[13] == (13, "node-1", 5)
    assert train.placement[23] == (23, "node-2", 7)
    sc = parse_scenario(
        "duration: 10\ncluster: {nodes: 3, gpus_per_node: 8}\n"
        "jobs: [{name: t, kind: training, nodes: [node-2, node-0], gpus: [6, 1, 7]}]\n"
    )
    assert sc.job("t").placement == (
        (0, "node-2", 6),
        (1, "node-2", 1),
        (2, "node-2", 7),
        (3, "node-0", 6),
        (4, "node-0", 1),
        (5, "node-0", 7),
    )


def test_defaults_fill_params_and_optional_fields() -> None:
    sc = parse_scenario(
        "duration: 100\ncluster: {nodes: 1}\n"
        "jobs: [{name: t, kind: training, nodes: [node-0], steps: 50, batch_tokens: 4096}]\n"
        "faults:\n"
        "  - {at: 10, kind: xid, target: {node: node-0, gpu: 7}}\n"
        "  - {at: 20, kind: straggler, target: {job: t, rank: 7}, duration: 5}\n"
        "  - {at: 30, kind: power_throttle, target: {node: node-0, gpu: 0}, params: {mode: brake}}\n"
    )
    assert sc.seed == 0 and sc.interval == 1.0 and sc.cluster.gpus_per_node == 8
    job = sc.job("t")
    assert job.steps == 50 and job.batch_tokens == 4096 and job.checkpoint_every == 600
    assert sc.faults[0].params == {"code": 79}
    assert sc.faults[1].params == {"slowdown": 1.3} and sc.faults[1].end == 25.0
    assert sc.faults[2].params == {"cap": 0.55, "mode": "brake"}


def test_every_fault_kind_of_design_is_accepted_with_its_target() -> None:
    targets = {
        ("node", "gpu"): "{node: node-1, gpu: 2}",
        ("node",): "{node: node-1}",
        ("job",): "{job: t}",
        ("job", "rank"): "{job: t, rank: 9}",
        ("service",): "{service: s}",
    }
    lines = [
        f"  - {{at: {i + 1}, kind: {k.name}, target: {targets[k.target]}}}"
        for i, k in enumerate(FAULT_KINDS.values())
    ]
    text = (
        "duration: 100\ncluster: {nodes: 2}\n"
        "jobs:\n  - {name: t, kind: training, nodes: [node-0, node-1], gpus: [0, 1, 2, 3, 4, 5]}\n"
        "  - {name: s, kind: inference, nodes: [node-1], gpus: [7]}\n"
        "faults:\n" + "\n".join(lines) + "\n"
    )
    sc = parse_scenario(text)
    assert [f.kind for f in sc.faults] == list(FAULT_KINDS)
    assert not sc.warnings  # every kind is simulated


def test_every_fault_kind_has_an_effect() -> None:
    assert set(EFFECTS) == set(FAULT_KINDS)


def test_builtin_scenarios_load() -> None:
    names = builtin_names()
    for required in (
        "demo",
        "healthy-3h",
        "xid",
        "ecc_dbe",
        "gpu_lost",
        "node_down",
        "thermal_throttle",
        "training_hang",
        "rank_dropout",
    ):
        assert required in names
    for name in names:
        sc = load_scenario(builtin_scenario(name))
        assert sc.name == name and not sc.warnings
    demo = load_scenario(builtin_scenario("demo"))
    assert (demo.cluster.nodes, demo.cluster.gpus_per_node) == (4, 8)
    assert 300 <= demo.duration <= 900 and min(f.at for f in demo.faults) <= 60
    assert load_scenario(builtin_scenario("healthy-3h")).faults == ()
    with pytest.raises(KeyError, match="no built-in scenario 'nope'"):
        builtin_scenario("nope")


BASE = (
    "seed: 1\n"  # 1
    "duration: 600\n"  # 2
    "cluster: {nodes: 2, gpus_per_node: 8}\n"  # 3
    "jobs:\n"  # 4
    "  - {name: train, kind: training, nodes: [node-0], end: 300}\n"  # 5
    "  - {name: chat, kind: inference, nodes: [node-1], gpus: [0, 1]}\n"  # 6
    "faults:\n"  # 7
)

# (text appended to BASE or replacing it, expected message); line numbers are 1-based
BROKEN = [
    (  # seen: accepted, and the run injected nothing (ranks past the world are dropped)
        "  - {at: 0, kind: slow_placement, target: {job: train}, params: {first_rank: 8, ranks: 8}}\n",
        "bad.yaml:8: faults[0].params.first_rank: 8 is beyond the world size of 'train' (ranks 0..7)",
    ),
    (
        "  - {at: 0, kind: slow_placement, target: {job: train}, params: {ranks: 8, slowdown: 1.3}}\n",
        "bad.yaml:8: faults[0].params.ranks: ranks 0..7 are the whole of 'train': no rank is left",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 9}}\n",
        "bad.yaml:8: faults[0].target.gpu: 9 is out of range 0..7",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-5, gpu: 1}}\n",
        "bad.yaml:8: faults[0].target.node: node-5 does not exist: the cluster has node-0..node-1",
    ),
    (
        "  - {at: 10, kind: boom, target: {node: node-1}}\n",
        "bad.yaml:8: faults[0].kind: unknown fault kind 'boom'",
    ),
    (
        "  - {at: 10, kind: straggler, target: {job: train, rank: 8}}\n",
        "bad.yaml:8: faults[0].target.rank: 8 is beyond the world size of 'train' (ranks 0..7)",
    ),
    (
        "  - {at: 10, kind: straggler, target: {job: ghost, rank: 1}}\n",
        "bad.yaml:8: faults[0].target.job: job 'ghost' is not defined (jobs: train, chat)",
    ),
    (
        "  - {at: 10, kind: training_hang, target: {job: chat}}\n",
        "bad.yaml:8: faults[0].target.job: training_hang needs a training job; 'chat' is an inference",
    ),
    (
        "  - {at: 10, kind: latency_spike, target: {service: train}}\n",
        "bad.yaml:8: faults[0].target.service: latency_spike needs an inference service; 'train' is a",
    ),
    (
        "  - {at: 400, kind: training_hang, target: {job: train}}\n",
        "bad.yaml:8: faults[0].at: 400 is outside the run of job 'train' (0..300)",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1}}\n",
        "bad.yaml:8: faults[0].target: missing required field 'gpu'",
    ),
    (
        "  - {at: 10, kind: node_down, target: {node: node-1, gpu: 1}}\n",
        "bad.yaml:8: faults[0].target.gpu: unknown field (known: node)",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 1}, params: {cod: 79}}\n",
        "bad.yaml:8: faults[0].params.cod: unknown parameter of xid (known: code)",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 1}, params: {code: high}}\n",
        "bad.yaml:8: faults[0].params.code: must be an integer, got 'high'",
    ),
    (
        "  - {at: 10, kind: straggler, target: {job: train, rank: 1}, params: {slowdown: 0.5}}\n",
        "bad.yaml:8: faults[0].params.slowdown: 0.5 is out of range 1.01..10",
    ),
    (
        "  - {at: 10, kind: power_throttle, target: {node: node-0, gpu: 1}, params: {mode: fire}}\n",
        "bad.yaml:8: faults[0].params.mode: 'fire' is not one of cap, brake",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 1}, duration: 0}\n",
        "bad.yaml:8: faults[0].duration: 0 must be greater than 0",
    ),
    (
        "  - {at: 700, kind: xid, target: {node: node-1, gpu: 1}}\n",
        "bad.yaml:8: faults[0].at: 700 is not before the end of the scenario (600)",
    ),
    (
        "  - {at: -1, kind: xid, target: {node: node-1, gpu: 1}}\n",
        "bad.yaml:8: faults[0].at: -1 must be at least 0",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 1}, when: now}\n",
        "bad.yaml:8: faults[0].when: unknown field (known: at, duration, kind, note, params, target)",
    ),
    (
        "  - {at: 1, kind: xid, target: {node: node-1, gpu: 1}}\n  - {at: 2, kind: xid}\n",
        "bad.yaml:9: faults[1]: missing required field 'target'",
    ),
    (
        "  - {at: 10, kind: xid, target: {node: node-1, gpu: 1},\n     params: {code: 79}, duration: ten}\n",
        "bad.yaml:9: faults[0].duration: must be a number, got 'ten'",
    ),
    (
        "  - at: 10\n    kind: xid\n    target:\n      node: node-1\n      gpu: 1.5\n",
        "bad.yaml:12: faults[0].target.gpu: must be an integer, got '1.5'",
    ),
    (
        "  - {at: 10, kind: xid, target: [node-1, 1]}\n",
        "bad.yaml:8: faults[0].target: must be a mapping, got a list",
    ),
    ("  - {at: 10, kind: xid, target: {node: node-1, gpu: 1}\n", "bad.yaml:9: not valid YAML"),
]

JOBS = "duration: 10\ncluster: {nodes: 2}\njobs:\n"
BROKEN_TOP = [
    ("duration: 10\n", "bad.yaml:1: missing required field 'cluster'"),
    ("cluster: {nodes: 1}\n", "bad.yaml:1: missing required field 'duration'"),
    ("duration: 10\ncluster: {nodes: 0}\n", "bad.yaml:2: cluster.nodes: 0 is out of range 1..4096"),
    (
        "duration: 10\ncluster: {nodes: 1, gpu_model: T4}\n",
        "bad.yaml:2: cluster.gpu_model: unknown GPU model 'T4'",
    ),
    ("duration: 10\ncluster: {nodes: 1}\nfoo: 1\n", "bad.yaml:3: foo: unknown field"),
    ("duration: 10\nduration: 20\ncluster: {nodes: 1}\n", "bad.yaml:2: duration: appears twice"),
    ("duration: soon\ncluster: {nodes: 1}\n", "bad.yaml:1: duration: must be a number, got 'soon'"),
    (
        "duration: 10\ninterval: 20\ncluster: {nodes: 1}\n",
        "bad.yaml:2: interval: 20 is longer than the duration 10",
    ),
    ("duration: 10\nseed: -3\ncluster: {nodes: 1}\n", "bad.yaml:2: seed: -3 is out of range 0.."),
    ("- 1\n- 2\n", "bad.yaml:1: must be a mapping, got a list"),
    ("", "bad.yaml:1: the scenario is empty"),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: t, kind: training, nodes: [node-2]}\n",
        "bad.yaml:4: jobs[0].nodes[0]: node-2 does not exist: the cluster has node-0..node-1",
    ),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: t, kind: batch, nodes: [node-0]}\n",
        "bad.yaml:4: jobs[0].kind: unknown job kind 'batch' (known: training, inference)",
    ),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: t, kind: training, nodes: [node-0], rps: 3}\n",
        "bad.yaml:4: jobs[0].rps: is not a field of a training job",
    ),
    (
        JOBS + "  - {name: t, kind: inference, nodes: [node-0], step_time: 1}\n",
        "bad.yaml:4: jobs[0].step_time: is not a field of an inference service",
    ),
    (
        JOBS + "  - {name: t, kind: training, nodes: [node-0], gpus: [8]}\n",
        "bad.yaml:4: jobs[0].gpus[0]: 8 is out of range 0..7",
    ),
    (
        JOBS + "  - {name: t, kind: training, nodes: [node-0], step_time: 0}\n",
        "bad.yaml:4: jobs[0].step_time: 0 must be greater than 0",
    ),
    (
        JOBS + "  - {name: t, kind: training, nodes: [node-0], start: 5, end: 5}\n",
        "bad.yaml:4: jobs[0].end: 5 must be after the start (5)",
    ),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: t, kind: training, nodes: [node-0, node-0]}\n",
        "bad.yaml:4: jobs[0].nodes[1]: node-0 is listed twice",
    ),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: t, kind: training, nodes: [node-0]}\n"
        "  - {name: t, kind: training, nodes: [node-1]}\n",
        "bad.yaml:5: jobs[1].name: job 't' is defined twice",
    ),
    (
        "duration: 10\ncluster: {nodes: 2}\njobs:\n  - {name: 'a b', kind: training, nodes: [node-0]}\n",
        "bad.yaml:4: jobs[0].name: 'a b' is not a valid name",
    ),
    (
        "duration: 100\ncluster: {nodes: 2}\njobs:\n"
        "  - {name: a, kind: training, nodes: [node-0, node-1], end: 50}\n"
        "  - {name: b, kind: inference, nodes: [node-1],\n     gpus: [3], start: 40}\n",
        "bad.yaml:5: jobs[1].nodes: node-1 GPU 3 is also allocated to job 'a' while both run (40..50 s)",
    ),
]


@pytest.mark.parametrize(("faults", "expected"), BROKEN)
def test_broken_fault_names_file_line_and_field(faults: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BASE + faults, name="bad.yaml")
    assert str(info.value).startswith(expected), str(info.value)


@pytest.mark.parametrize(("text", "expected"), BROKEN_TOP)
def test_broken_file_names_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, name="bad.yaml")
    assert str(info.value).startswith(expected), str(info.value)


def test_jobs_that_do_not_overlap_in_time_may_share_gpus() -> None:
    sc = parse_scenario(
        "duration: 100\ncluster: {nodes: 1}\njobs:\n"
        "  - {name: a, kind: training, nodes: [node-0], end: 50}\n"
        "  - {name: b, kind: training, nodes: [node-0], start: 50}\n"
    )
    assert [j.name for j in sc.jobs] == ["a", "b"]


def test_load_scenario_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"^absent\.yaml: cannot read the file"):
        load_scenario(tmp_path / "absent.yaml")


def test_a_built_in_scenario_is_named_without_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``gpuscope sim-eval demo`` said ``demo: cannot read the file``."""
    monkeypatch.chdir(tmp_path)
    assert load_scenario("xid") == load_scenario(builtin_scenario("xid"))
    with pytest.raises(ScenarioError) as refused:
        load_scenario("dmeo")
    assert str(refused.value).startswith("dmeo: cannot read the file (No such file or directory); built-in ")
    assert "built-in scenarios: demo, ecc_dbe, " in str(refused.value)
    (tmp_path / "xid").write_text("duration: 10\ncluster: {nodes: 1}\n")  # a file of that name wins
    assert load_scenario("xid").duration == 10


def test_plain_exponent_numbers_are_numbers() -> None:
    sc = parse_scenario("duration: 3.6e3\ncluster: {nodes: 1}\n")
    assert sc.duration == 3600.0
