"""Pod metadata the kubelet's pod-resources API lacks: UID, workload owner and team.

Two sources. The API server (in-cluster: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service
account's ``token`` and ``ca.crt``, as client-go's ``InClusterConfig`` reads them; kubernetes/kubernetes
staging/src/k8s.io/client-go/rest/config.go at 047855f) lists the node's pods
(``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``); the workload is the pod's controller
``ownerReference`` (a Job, a Kubeflow PyTorchJob, a StatefulSet), and a ReplicaSet's own controller
(the Deployment) through ``GET /apis/apps/v1/namespaces/<ns>/replicasets/<name>``. Or a downward-API
volume of the pod itself (``labels`` and ``uid`` files, no owner; labels one ``key="value"`` a line, as
kubernetes/kubernetes pkg/fieldpath/fieldpath.go ``FormatMap`` at 00bdb3f writes them).

The team is the value of one pod label (``team`` unless configured).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gpuscope.identity import pod_key

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TEAM_LABEL = "team"
#: the training SDK's own pod: the directory of a downward-API volume, and the team label to read
PODINFO_ENV = "GPUSCOPE_PODINFO"
TEAM_LABEL_ENV = "GPUSCOPE_TEAM_LABEL"


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What a pod's metadata says about who owns it."""

    uid: str = ""
    #: ``<Kind>/<name>`` of the controlling workload, e.g. ``PyTorchJob/bert``, ``Deployment/api``
    workload: str = ""
    team: str = ""

    def labels(self) -> dict[str, str]:
        out = {"pod_uid": self.uid, "workload": self.workload, "team": self.team}
        return {k: v for k, v in out.items() if v}


def _controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return str(ref["kind"]), str(ref["name"])
    return None


class ApiServerPods:
    """Pod metadata of one node from the Kubernetes API server."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        verify: str | bool = True,
        team_label: str = DEFAULT_TEAM_LABEL,
        timeout: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.team_label = team_label
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            verify=verify,
            timeout=timeout,
        )
        self._replicasets: dict[tuple[str, str], tuple[str, str] | None] = {}

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str], account_dir: str = SERVICE_ACCOUNT, team_label: str = DEFAULT_TEAM_LABEL
    ) -> ApiServerPods:
        """The API server as a pod sees it; ValueError naming what is missing outside a cluster."""
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ValueError("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT unset")
        token_file, ca_file = os.path.join(account_dir, "token"), os.path.join(account_dir, "ca.crt")
        for path in (token_file, ca_file):
            if not os.path.isfile(path):
                raise ValueError(f"no service-account file {path}: cannot authenticate to the API server")
        with open(token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", token, verify=ca_file, team_label=team_label)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        try:
            resp = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"Kubernetes API {path}: {exc}") from exc
        if resp.status_code != 200:
            raise RuntimeError(f"Kubernetes API {path}: HTTP {resp.status_code}")
        try:
            doc = resp.json()
        except json.JSONDecodeError as exc:
            raise RuntimeError(f"Kubernetes API {path}: not JSON") from exc
        if not isinstance(doc, dict):
            raise RuntimeError(f"Kubernetes API {path}: not an object")
        return doc

    def _replicaset_owner(self, namespace: str, name: str) -> tuple[str, str] | None:
        key = (namespace, name)
        if key not in self._replicasets:
            rs = self._get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}")
            self._replicasets[key] = _controller(rs.get("metadata") or {})
        return self._replicasets[key]

    def node_pods(self, node: str) -> dict[str, PodMeta]:
        """``{namespace/name: PodMeta}`` of the pods scheduled on ``node``."""
        doc = self._get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        out: dict[str, PodMeta] = {}
        for item in doc.get("items") or ():
            meta = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(meta, dict) or not meta.get("name"):
                continue
            namespace = str(meta.get("namespace") or "default")
            owner = _controller(meta)
            if owner is not None and owner[0] == "ReplicaSet":
                owner = self._replicaset_owner(namespace, owner[1]) or owner
            labels = meta.get("labels") or {}
            out[pod_key(namespace, str(meta["name"]))] = PodMeta(
                uid=str(meta.get("uid") or ""),
                workload=f"{owner[0]}/{owner[1]}" if owner else "",
                team=str(labels.get(self.team_label) or "") if isinstance(labels, dict) else "",
            )
        return out

    def close(self) -> None:
        self._client.close()


def parse_downward_map(text: str) -> dict[str, str]:
    """A downward-API ``labels``/``annotations`` file: ``key="value"`` lines, values Go-quoted."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out[key] = str(parsed)
    return out


def downward_pod(directory: str, team_label: str = DEFAULT_TEAM_LABEL) -> PodMeta:
    """The pod's own metadata from a downward-API volume; files it lacks are left blank."""

    def read(name: str) -> str:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return ""

    labels = parse_downward_map(read("labels"))
    # the downward API exposes no ownerReferences: the workload comes from the API server only
    return PodMeta(uid=read("uid"), team=labels.get(team_label, ""))


def own_pod(env: Mapping[str, str]) -> dict[str, str]:
    """``pod_uid`` and ``team`` of the pod this process runs in, when ``GPUSCOPE_PODINFO`` names its
    downward-API volume; empty otherwise."""
    directory = env.get(PODINFO_ENV)
    if not directory:
        return {}
    return downward_pod(directory, env.get(TEAM_LABEL_ENV) or DEFAULT_TEAM_LABEL).labels()
