"""Which pod holds which GPU, from the kubelet: the ``kubelet`` collector (``--kubelet-socket``).

Calls the kubelet's PodResources gRPC API (``/var/lib/kubelet/pod-resources/kubelet.sock``;
``List`` and ``GetAllocatableResources``, GA since Kubernetes 1.28) through
:class:`~gpuscope.collect.podresources.PodResourcesClient`. Unlike NVML's
process list, it names the owner of a GPU that runs no process, the idle-allocation case.

Per round, a row per allocatable GPU (``gpu_allocatable``, labels node, uuid and, where NVML
knows it, gpu) and a row per allocation (``gpu_owner_allocated``, plus the attribution labels pod
(``namespace/name``, :func:`gpuscope.identity.pod_key`, as on every path) and namespace, container,
and ``owner`` = ``namespace/name/container``). With ``--kube-api`` the pod's metadata from the API
server (:mod:`gpuscope.kube.metadata`) adds ``pod_uid``, ``workload`` (its controller) and ``team``.
Device ids are GPU or MIG UUIDs under the NVIDIA device plugin's default ``--device-id-strategy=uuid``;
time-slicing replicas (``<uuid>::<n>``) are the same GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Self

import grpc

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.nvml import frame
from gpuscope.collect.nvml_api import nvml_library_present, uuid_indices
from gpuscope.collect.podresources import DEFAULT_SOCKET, PodResourcesClient, device_uuid, is_gpu
from gpuscope.identity import pod_key
from gpuscope.kube.metadata import DEFAULT_TEAM_LABEL, ApiServerPods, PodMeta
from gpuscope.model import Labels
from gpuscope.signals import DETAIL_METRICS


def _default_index() -> Mapping[str, str]:
    return uuid_indices() if nvml_library_present() else {}


@register_collector
class KubeletCollector(Collector):
    """GPU allocations of pods on this node, from the kubelet's pod-resources API."""

    name = "kubelet"
    enabled_by = ("kubelet_socket",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        socket_path: str = DEFAULT_SOCKET,
        uuid_index: Callable[[], Mapping[str, str]] = _default_index,
        api: ApiServerPods | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.client = PodResourcesClient(socket_path)
        self.api = api
        self._uuid_index = uuid_index
        self._index: Mapping[str, str] | None = None

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        return cls(
            ctx.node,
            proc_root=ctx.proc_root,
            sys_root=ctx.sys_root,
            socket_path=str(ctx.options["kubelet_socket"]),
            api=ApiServerPods.in_cluster(
                os.environ, team_label=str(ctx.options.get("team_label") or DEFAULT_TEAM_LABEL)
            )
            if ctx.options.get("kube_api")
            else None,
        )

    def _gpu_labels(self, uuid: str) -> Labels:
        if self._index is None or uuid not in self._index:
            self._index = self._uuid_index()
        labels: Labels = {"node": self.node, "uuid": uuid}
        if uuid in self._index:
            labels["gpu"] = self._index[uuid]
        return labels

    def collect(self, now: float) -> Collected:
        out = Collected()
        try:
            pods = self.client.list()
        except grpc.RpcError as exc:
            raise RuntimeError(f"kubelet pod-resources List at {self.client.target}: {exc.code()}") from exc
        rows: list[tuple[Labels, dict[str, float]]] = []
        try:
            alloc = self.client.allocatable()
        except grpc.RpcError as exc:  # kubelets before 1.23 lack it; allocations still count
            out.errors.append(CollectorError("kubelet_allocatable", f"GetAllocatableResources: {exc.code()}"))
        else:
            seen: set[str] = set()
            for dev in alloc.devices:
                if is_gpu(dev.resource_name):
                    for did in dev.device_ids:
                        uuid = device_uuid(did)
                        if uuid not in seen:
                            seen.add(uuid)
                            rows.append((self._gpu_labels(uuid), {"gpu_allocatable": 1.0}))
        meta: Mapping[str, PodMeta] = {}
        if self.api is not None:
            try:
                meta = self.api.node_pods(self.node)
            except RuntimeError as exc:  # allocations still count without the owner's metadata
                out.errors.append(CollectorError("kube_api", str(exc)))
        for pod in pods.pod_resources:
            key = pod_key(pod.namespace, pod.name)
            extra = meta[key].labels() if key in meta else {}
            for container in pod.containers:
                for dev in container.devices:
                    if not is_gpu(dev.resource_name):
                        continue
                    for uuid in dict.fromkeys(device_uuid(d) for d in dev.device_ids):
                        labels = {
                            **self._gpu_labels(uuid),
                            "owner": f"{key}/{container.name}",
                            "pod": key,
                            "namespace": pod.namespace,
                            "container": container.name,
                            **extra,
                        }
                        rows.append((labels, {"gpu_owner_allocated": 1.0}))
        f = frame(now, DETAIL_METRICS, rows)
        if f is not None:
            out.frames.append(f)
        return out

    def close(self) -> None:
        self.client.close()
        if self.api is not None:
            self.api.close()
