"""The kubelet's pod-resources API, and what it tells about the pod a GPU process runs in.

:class:`PodResourcesClient` calls ``List`` and ``GetAllocatableResources`` (GA since Kubernetes
1.28) over the kubelet's unix socket with the message classes generated from the kubelet's own
proto (:mod:`gpuscope.kube.podresources_pb2`).

:class:`PodNames` names the pod of a GPU process by ``namespace/name``
(:func:`gpuscope.identity.pod_key`), as the kubelet, dcgm-exporter and the API server do, where
the process's cgroup (``kubepods-…-pod<uid>.slice``) gives only the pod's UID. Resolved, first hit
wins: by UID from the API server's pod list (``--kube-api``); else from the kubelet's allocations of
the process's GPU: the one pod holding it, or under time-slicing the one whose name is the process's
``HOSTNAME`` (a container's hostname is its pod's name unless the pod sets another). A pod neither
source names keeps its UID as the ``pod`` label, so nothing is attributed to the wrong pod.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from gpuscope.collect.attribution import ProcessOwner
from gpuscope.collect.base import CollectorError
from gpuscope.identity import pod_key
from gpuscope.kube import podresources_pb2 as pb
from gpuscope.kube.metadata import ApiServerPods

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: the service as the proto declares it (package v1, service PodResourcesLister)
SERVICE = "/v1.PodResourcesLister"
GPU_RESOURCES = frozenset({"nvidia.com/gpu"})
_REPLICA = "::"
#: how often an unknown pod UID may send the resolver back to its sources
REFRESH_S = 10.0
#: answers fetched this recently serve every UID met meanwhile (a pod's GPUs are met in one round)
FETCH_GAP_S = 1.0


def device_uuid(device_id: str) -> str:
    """The GPU a device id names: ``GPU-…::3`` (a time-slicing replica) is ``GPU-…``."""
    return device_id.split(_REPLICA, 1)[0]


def is_gpu(resource: str) -> bool:
    # MIG strategy "mixed" advertises nvidia.com/mig-1g.10gb and the like
    return resource in GPU_RESOURCES or resource.startswith("nvidia.com/mig-")


class PodResourcesClient:
    """``List`` and ``GetAllocatableResources`` over the kubelet's unix socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.target = f"unix://{socket_path}"
        self.timeout = timeout
        self._channel: Any = None

    def _call(self, method: str, request: Any, response: Any) -> Any:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.target)
        stub = self._channel.unary_unary(
            f"{SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return stub(request, timeout=self.timeout)

    def list(self) -> pb.ListPodResourcesResponse:
        got: pb.ListPodResourcesResponse = self._call(
            "List", pb.ListPodResourcesRequest(), pb.ListPodResourcesResponse
        )
        return got

    def allocatable(self) -> pb.AllocatableResourcesResponse:
        got: pb.AllocatableResourcesResponse = self._call(
            "GetAllocatableResources", pb.AllocatableResourcesRequest(), pb.AllocatableResourcesResponse
        )
        return got

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


@dataclass(frozen=True, slots=True)
class Holder:
    """A container the kubelet allocated a GPU to."""

    namespace: str
    name: str
    container: str


def gpu_holders(pods: pb.ListPodResourcesResponse) -> dict[str, list[Holder]]:
    """``{GPU or MIG UUID: the containers allocated it}`` from a ``List`` answer."""
    out: dict[str, list[Holder]] = {}
    for pod in pods.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if is_gpu(dev.resource_name):
                    for uuid in dict.fromkeys(device_uuid(d) for d in dev.device_ids):
                        out.setdefault(uuid, []).append(Holder(pod.namespace, pod.name, container.name))
    return out


class PodNames:
    """Resolves the pod UID of a process's cgroup to the ``namespace/name`` every other path uses.

    A UID names one pod for ever, so an answer is kept; a UID met for the first time asks the
    sources afresh, one no source names asks again at most every ``refresh_s`` seconds."""

    #: answers kept at most (pods come and go on a node; a day of churn is far below this)
    MAX_KEPT = 4096

    def __init__(
        self,
        node: str,
        *,
        client: PodResourcesClient | None = None,
        api: ApiServerPods | None = None,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.client = client
        self.api = api
        self.refresh_s = refresh_s
        self._clock = clock
        self._by_uid: dict[str, str] = {}
        self._holders: dict[str, list[Holder]] = {}
        self._kept: dict[tuple[str, tuple[str, ...]], tuple[str, str, str]] = {}
        self._tried: dict[tuple[str, tuple[str, ...]], float] = {}
        self._errors: list[CollectorError] = []
        self._fetched = -math.inf

    def _refresh(self, now: float) -> None:
        if now - self._fetched < FETCH_GAP_S:
            return
        self._fetched = now
        if self.api is not None:
            try:
                meta = self.api.node_pods(self.node)
            except RuntimeError as exc:  # the kubelet's allocations may still name the pod
                self._errors.append(CollectorError("kube_api", str(exc)))
            else:
                self._by_uid = {m.uid: key for key, m in meta.items() if m.uid}
        if self.client is not None:
            try:
                self._holders = gpu_holders(self.client.list())
            except grpc.RpcError as exc:
                self._errors.append(CollectorError("kubelet_list", f"pod-resources List: {exc.code()}"))

    def resolve(self, owner: ProcessOwner, gpu_uuids: Iterable[str]) -> ProcessOwner:
        """``owner`` with ``pod`` as ``namespace/name``, its namespace, and its container's name where
        the kubelet allocated it this GPU (``gpu_uuids``: the GPU and its MIG instances); unchanged when
        no source names the pod."""
        uid = owner.pod_uid
        if not uid:
            return owner
        key = (uid, tuple(gpu_uuids))
        if key not in self._kept:
            now = self._clock()
            if now - self._tried.get(key, -math.inf) < self.refresh_s:
                return owner
            self._refresh(now)
            found = self._lookup(owner, key[1])
            if found is None:
                self._tried[key] = now
                return owner
            if len(self._kept) >= self.MAX_KEPT:
                self._kept.clear()
                self._tried.clear()
            self._kept[key] = found
            self._tried.pop(key, None)
        namespace, name, container = self._kept[key]
        return replace(
            owner, pod=pod_key(namespace, name), namespace=namespace, container=container or owner.container
        )

    def _lookup(self, owner: ProcessOwner, uuids: tuple[str, ...]) -> tuple[str, str, str] | None:
        held = [h for u in uuids for h in self._holders.get(u, ())]
        named = self._by_uid.get(owner.pod_uid or "")
        if named is not None:
            namespace, name = named.split("/", 1)
        else:
            pods = {(h.namespace, h.name) for h in held}
            if owner.hostname:
                pods = {p for p in pods if p[1] == owner.hostname}
            if len(pods) != 1:
                return None  # nobody, or several pods share the GPU and none is the hostname
            ((namespace, name),) = pods
        containers = {h.container for h in held if (h.namespace, h.name) == (namespace, name)}
        return namespace, name, containers.pop() if len(containers) == 1 else ""

    def take_errors(self) -> list[CollectorError]:
        out, self._errors = self._errors, []
        return out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.api is not None:
            self.api.close()
