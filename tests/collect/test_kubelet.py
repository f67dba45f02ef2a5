"""The kubelet collector against an in-process gRPC server that serves the kubelet's real
pod-resources proto (kubernetes/kubelet pkg/apis/podresources/v1/api.proto at 63b3249, generated
into gpuscope.kube.podresources_pb2) on a unix socket, as the kubelet does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest

from gpuscope.collect.base import CollectorContext, build_collectors
from gpuscope.collect.dcgm import owner_of
from gpuscope.collect.fake_nvml import FakeNvml, FakeProcess
from gpuscope.collect.kubelet import KubeletCollector
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.podresources import PodNames, PodResourcesClient
from gpuscope.kube import podresources_pb2 as pb
from gpuscope.kube.metadata import ApiServerPods, PodMeta, downward_pod, parse_downward_map
from gpuscope.model import Frame
from kubeapi import kube_api_server

GPU_A = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
GPU_B = "GPU-5e6f7a8b-0000-1111-2222-333344445555"
GPU_IDLE = "GPU-9c0d1e2f-0000-1111-2222-333344445555"


def pods() -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="trainer-0",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="pytorch",
                        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU_A])],
                    )
                ],
            ),
            # time-slicing: two pods on replicas of one GPU
            *(
                pb.PodResources(
                    name=f"notebook-{i}",
                    namespace="research",
                    containers=[
                        pb.ContainerResources(
                            name="jupyter",
                            devices=[
                                pb.ContainerDevices(
                                    resource_name="nvidia.com/gpu", device_ids=[f"{GPU_B}::{i}"]
                                ),
                                pb.ContainerDevices(resource_name="example.com/nic", device_ids=["nic0"]),
                            ],
                        )
                    ],
                )
                for i in (0, 1)
            ),
            pb.PodResources(
                name="web", namespace="default", containers=[pb.ContainerResources(name="nginx")]
            ),
        ]
    )


def allocatable() -> pb.AllocatableResourcesResponse:
    ids = [GPU_A, f"{GPU_B}::0", f"{GPU_B}::1", GPU_IDLE]
    return pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)], cpu_ids=[0, 1]
    )


#: the methods the kubelet fixture was called with, in order
CALLS: list[str] = []


def _answer(method: str, response: Callable[[], Any]) -> Callable[[Any, Any], Any]:
    def handle(request: Any, context: Any) -> Any:
        CALLS.append(method)
        return response()

    return handle


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[str]:
    CALLS.clear()
    handlers = {
        "List": grpc.unary_unary_rpc_method_handler(
            _answer("List", pods),
            request_deserializer=pb.ListPodResourcesRequest.FromString,
            response_serializer=pb.ListPodResourcesResponse.SerializeToString,
        ),
        "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
            _answer("GetAllocatableResources", allocatable),
            request_deserializer=pb.AllocatableResourcesRequest.FromString,
            response_serializer=pb.AllocatableResourcesResponse.SerializeToString,
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
    )
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield str(sock)
    server.stop(None)


def rows(frames: list[Frame]) -> list[tuple[dict[str, str], dict[str, float]]]:
    return [
        (
            labels,
            {m: float(f.values[i, j]) for j, m in enumerate(f.metrics) if f.values[i, j] == f.values[i, j]},
        )
        for f in frames
        for i, labels in enumerate(f.entities)
    ]


def test_allocations_and_allocatable_gpus_from_the_kubelet(kubelet: str) -> None:
    c = KubeletCollector(
        "gpu-7", socket_path=kubelet, uuid_index=lambda: {GPU_A: "0", GPU_B: "1", GPU_IDLE: "2"}
    )
    try:
        got = c.collect(1.0)
    finally:
        c.close()
    assert got.errors == []
    got_rows = rows(got.frames)
    allocatable_gpus = {labels["gpu"] for labels, v in got_rows if v.get("gpu_allocatable") == 1}
    assert allocatable_gpus == {"0", "1", "2"}
    owners = {
        (labels["gpu"], labels["owner"]): labels
        for labels, v in got_rows
        if v.get("gpu_owner_allocated") == 1
    }
    assert set(owners) == {
        ("0", "ml/trainer-0/pytorch"),
        ("1", "research/notebook-0/jupyter"),
        ("1", "research/notebook-1/jupyter"),
    }
    a = owners[("0", "ml/trainer-0/pytorch")]
    assert (a["pod"], a["namespace"], a["container"], a["uuid"], a["node"]) == (
        "ml/trainer-0",
        "ml",
        "pytorch",
        GPU_A,
        "gpu-7",
    )
    # GPU 2 is allocatable and nobody holds it; GPU 0 is held whether or not a process runs on it
    # dcgm-exporter's pod/namespace labels of the same pod (transformation/const.go) name it the same
    assert owner_of({"pod": "trainer-0", "namespace": "ml", "container": "pytorch"})["pod"] == a["pod"]


def test_a_missing_kubelet_is_a_clear_failure(tmp_path: Path) -> None:
    c = KubeletCollector("n", socket_path=str(tmp_path / "absent.sock"), uuid_index=dict)
    with pytest.raises(RuntimeError, match="pod-resources List"):
        c.collect(1.0)
    c.close()


KUBE = Path(__file__).parent / "fixtures" / "kube"
TOKEN = "sa-token-for-tests"


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that answers as the API server with the recorded responses."""
    docs = {
        "/api/v1/pods": (KUBE / "pods-gpu-7.json").read_bytes(),
        "/apis/apps/v1/namespaces/research/replicasets/notebook-7d4b9c6f8": (
            KUBE / "replicaset-notebook.json"
        ).read_bytes(),
    }

    def answer(path: str, authorization: str | None) -> tuple[int, bytes]:
        url = urlsplit(path)
        body = docs.get(url.path)
        if authorization != f"Bearer {TOKEN}":
            return 401, b'{"kind":"Status","code":401}'
        if body is None or (
            url.path == "/api/v1/pods" and parse_qs(url.query).get("fieldSelector") != ["spec.nodeName=gpu-7"]
        ):
            return 404, b'{"kind":"Status","code":404}'
        return 200, body

    with kube_api_server(answer) as server:
        yield server


def test_workload_owner_and_team_come_from_the_api_server(
    kubelet: str, api_server: tuple[str, list[str]]
) -> None:
    url, seen = api_server
    c = KubeletCollector(
        "gpu-7",
        socket_path=kubelet,
        uuid_index=lambda: {GPU_A: "0", GPU_B: "1", GPU_IDLE: "2"},
        api=ApiServerPods(url, TOKEN),
    )
    try:
        got = c.collect(1.0)
        c.collect(2.0)
    finally:
        c.close()
    assert got.errors == []
    owners = {labels["pod"]: labels for labels, v in rows(got.frames) if v.get("gpu_owner_allocated") == 1}
    trainer = owners["ml/trainer-0"]
    assert (trainer["pod_uid"], trainer["workload"], trainer["team"]) == (
        "6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60",
        "PyTorchJob/bert",
        "nlp",
    )
    # a Deployment's pod is owned by a ReplicaSet; the workload is the ReplicaSet's own controller
    assert (owners["research/notebook-0"]["workload"], owners["research/notebook-0"]["team"]) == (
        "Deployment/notebook",
        "vision",
    )
    assert owners["research/notebook-1"]["workload"] == "Job/eval"
    assert "team" not in owners["research/notebook-1"]  # no team label, no team
    # the ReplicaSet is asked for once, not once per round
    assert sum("/replicasets/" in p for p in seen) == 1


def test_an_unreachable_api_server_keeps_the_allocations(
    kubelet: str, api_server: tuple[str, list[str]]
) -> None:
    url, _ = api_server
    c = KubeletCollector("gpu-7", socket_path=kubelet, uuid_index=dict, api=ApiServerPods(url, "wrong-token"))
    try:
        got = c.collect(1.0)
    finally:
        c.close()
    assert [e.kind for e in got.errors] == ["kube_api"]
    assert "HTTP 401" in got.errors[0].message and "wrong-token" not in got.errors[0].message
    owners = [labels for labels, v in rows(got.frames) if v.get("gpu_owner_allocated") == 1]
    assert len(owners) == 3 and all("pod_uid" not in o for o in owners)


def test_in_cluster_refuses_without_the_service_account(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        ApiServerPods.in_cluster({}, str(tmp_path))
    with pytest.raises(ValueError, match="token"):
        ApiServerPods.in_cluster(env, str(tmp_path))
    (tmp_path / "token").write_text("t\n")
    with pytest.raises(ValueError, match=r"ca\.crt"):
        ApiServerPods.in_cluster(env, str(tmp_path))


def test_team_and_uid_from_a_downward_api_volume(tmp_path: Path) -> None:
    # the kubelet writes labels as FormatMap does: sorted key="value" lines, Go-quoted
    (tmp_path / "labels").write_text('app="trainer"\nnote="a \\"quoted\\" word"\nteam="nlp"')
    (tmp_path / "uid").write_text("6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60")
    assert parse_downward_map((tmp_path / "labels").read_text())["note"] == 'a "quoted" word'
    assert downward_pod(str(tmp_path)) == PodMeta(uid="6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60", team="nlp")
    assert downward_pod(str(tmp_path), team_label="app").team == "trainer"
    assert downward_pod(str(tmp_path / "absent")) == PodMeta()


TRAINER_UID = "6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60"  # ml/trainer-0 in pods-gpu-7.json
NOTEBOOK_1_UID = "2f3e4d5c-6b7a-4899-a8b7-c6d5e4f3a211"  # research/notebook-1
POD_LABELS = ("pod", "namespace", "container", "pod_uid")


def pod_process(proc: Path, pid: int, uid: str, hostname: str | None = None) -> None:
    """A process in a pod as procfs shows it: the systemd cgroup driver's path (UID with ``_``)."""
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope\n"
    )
    env = b"PATH=/bin\0" + (f"HOSTNAME={hostname}\0".encode() if hostname else b"")
    (proc / str(pid) / "environ").write_bytes(env)


def nvml_on(proc: Path, socket: str, api: ApiServerPods | None = None) -> tuple[NvmlCollector, FakeNvml]:
    fake = FakeNvml.healthy(2)
    fake.gpus[0].uuid, fake.gpus[1].uuid = GPU_A, GPU_B
    pods = PodNames("gpu-7", client=PodResourcesClient(socket), api=api)
    return NvmlCollector("gpu-7", proc_root=str(proc), lib=fake, watch_events=False, pods=pods), fake


def process_rows(got_frames: list[Frame]) -> dict[str, dict[str, str]]:
    return {labels["pid"]: labels for f in got_frames for labels in f.entities if "pid" in labels}


def test_a_pod_has_the_same_labels_on_the_cgroup_path_as_on_the_kubelet_path(
    kubelet: str, api_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = api_server
    proc = tmp_path / "proc"
    pod_process(proc, 101, TRAINER_UID)
    pod_process(proc, 202, NOTEBOOK_1_UID)  # time-sliced GPU B: only the API server tells the pods apart
    nvml, fake = nvml_on(proc, kubelet, ApiServerPods(url, TOKEN))
    fake.gpus[0].processes = [FakeProcess(101, 2**30)]
    fake.gpus[1].processes = [FakeProcess(202, 2**30)]
    kube = KubeletCollector("gpu-7", socket_path=kubelet, uuid_index=dict, api=ApiServerPods(url, TOKEN))
    try:
        via_nvml = nvml.collect(1.0)
        via_kubelet = kube.collect(1.0)
    finally:
        nvml.close()
        kube.close()
    assert via_nvml.errors == [] and via_kubelet.errors == []
    allocated = {
        labels["uuid"] + labels["pod"]: labels
        for labels, v in rows(via_kubelet.frames)
        if v.get("gpu_owner_allocated") == 1
    }
    procs = process_rows(via_nvml.frames)
    for pid, uuid, pod in (("101", GPU_A, "ml/trainer-0"), ("202", GPU_B, "research/notebook-1")):
        assert procs[pid]["pod"] == pod
        assert {k: procs[pid][k] for k in POD_LABELS} == {k: allocated[uuid + pod][k] for k in POD_LABELS}
    # the GPU's own row names its user the same way; the UID stays off it so the GPU keeps one series
    gpu_rows = {e["uuid"]: e for f in via_nvml.frames for e in f.entities if not {"pid", "link"} & set(e)}
    assert (gpu_rows[GPU_A]["pod"], gpu_rows[GPU_A]["namespace"], gpu_rows[GPU_A]["container"]) == (
        "ml/trainer-0",
        "ml",
        "pytorch",
    )
    assert "pod_uid" not in gpu_rows[GPU_A]


def test_without_the_api_server_the_kubelet_allocation_names_the_pod(kubelet: str, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    pod_process(proc, 101, TRAINER_UID)  # the only pod holding GPU A
    pod_process(proc, 202, NOTEBOOK_1_UID, hostname="notebook-1")  # GPU B is shared: its hostname tells
    pod_process(proc, 303, "0a0b0c0d-1111-4222-8333-444455556666")  # shared GPU, no hostname: ambiguous
    nvml, fake = nvml_on(proc, kubelet)
    fake.gpus[0].processes = [FakeProcess(101, 2**30)]
    fake.gpus[1].processes = [FakeProcess(202, 2**30), FakeProcess(303, 2**29)]
    try:
        procs = process_rows(nvml.collect(1.0).frames)
        nvml.collect(2.0)
    finally:
        nvml.close()
    # three new pods met in one round: the kubelet is asked once; answers are kept, so not again
    assert CALLS == ["List"]
    assert {k: procs["101"][k] for k in POD_LABELS} == {
        "pod": "ml/trainer-0",
        "namespace": "ml",
        "container": "pytorch",
        "pod_uid": TRAINER_UID,
    }
    assert (procs["202"]["pod"], procs["202"]["container"]) == ("research/notebook-1", "jupyter")
    # never guessed: a pod no source names keeps its UID
    assert procs["303"]["pod"] == procs["303"]["pod_uid"] == "0a0b0c0d-1111-4222-8333-444455556666"
    assert "namespace" not in procs["303"]


def test_an_unreachable_kubelet_keeps_the_uid_and_is_counted(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    pod_process(proc, 101, TRAINER_UID)
    nvml, fake = nvml_on(proc, str(tmp_path / "absent.sock"))
    fake.gpus[0].processes = [FakeProcess(101, 2**30)]
    try:
        got = nvml.collect(1.0)
        again = nvml.collect(2.0)  # not asked again within the refresh interval
    finally:
        nvml.close()
    assert [e.kind for e in got.errors] == ["kubelet_list"] and again.errors == []
    assert process_rows(got.frames)["101"]["pod"] == TRAINER_UID


def test_the_agents_kubelet_socket_option_names_pods_on_the_nvml_path(kubelet: str, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    pod_process(proc, 101, TRAINER_UID)
    fake = FakeNvml.healthy(1)
    fake.gpus[0].uuid = GPU_A
    fake.gpus[0].processes = [FakeProcess(101, 2**30)]
    options = {"nvml_lib": fake, "kubelet_socket": kubelet}
    ctx = CollectorContext("gpu-7", proc_root=str(proc), options=options)
    (nvml,) = build_collectors(["nvml"], ctx)
    try:
        assert process_rows(nvml.collect(1.0).frames)["101"]["pod"] == "ml/trainer-0"
    finally:
        nvml.close()
