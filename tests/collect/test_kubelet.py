"""The kubelet collector against an in-process gRPC server that serves the kubelet's real
pod-resources proto (kubernetes/kubelet pkg/apis/podresources/v1/api.proto at 63b3249, generated
into gpuscope.kube.podresources_pb2) on a unix socket, as the kubelet does."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuscope.collect.kubelet import KubeletCollector
from gpuscope.kube import podresources_pb2 as pb
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
        "trainer-0",
        "ml",
        "pytorch",
        GPU_A,
        "gpu-7",
    )
    # GPU 2 is allocatable and nobody holds it; GPU 0 is held whether or not a process runs on it


def test_a_missing_kubelet_is_a_clear_failure(tmp_path: Path) -> None:
    c = KubeletCollector("n", socket_path=str(tmp_path / "absent.sock"), uuid_index=dict)
    with pytest.raises(RuntimeError, match="pod-resources List"):
        c.collect(1.0)
    c.close()
