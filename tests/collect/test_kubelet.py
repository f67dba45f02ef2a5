"""The kubelet collector against an in-process gRPC server that serves the kubelet's real
pod-resources proto (kubernetes/kubelet pkg/apis/podresources/v1/api.proto at 63b3249, generated
into gpuscope.kube.podresources_pb2) on a unix socket, as the kubelet does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest

from gpuscope.collect.dcgm import owner_of
from gpuscope.collect.kubelet import KubeletCollector
from gpuscope.kube import podresources_pb2 as pb
from gpuscope.kube.metadata import ApiServerPods, PodMeta, downward_pod, parse_downward_map
from gpuscope.model import Frame

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


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[str]:
    handlers = {
        "List": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: pods(),
            request_deserializer=pb.ListPodResourcesRequest.FromString,
            response_serializer=pb.ListPodResourcesResponse.SerializeToString,
        ),
        "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: allocatable(),
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
    seen: list[str] = []
    docs = {
        "/api/v1/pods": (KUBE / "pods-gpu-7.json").read_bytes(),
        "/apis/apps/v1/namespaces/research/replicasets/notebook-7d4b9c6f8": (
            KUBE / "replicaset-notebook.json"
        ).read_bytes(),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            seen.append(self.path)
            body = docs.get(url.path)
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                body = b'{"kind":"Status","code":401}'
            elif body is None or (
                url.path == "/api/v1/pods"
                and parse_qs(url.query).get("fieldSelector") != ["spec.nodeName=gpu-7"]
            ):
                self.send_response(404)
                body = b'{"kind":"Status","code":404}'
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


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
