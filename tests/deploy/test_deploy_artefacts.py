"""Deployment artefacts, checked offline: systemd units (systemd-analyze), Kubernetes manifests
(their API schemas, via kubernetes-validate), the Containerfile, and the command lines they run."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml

from gpuscope import __version__
from gpuscope.cli import build_parser
from gpuscope.config_check import check_config
from gpuscope.kube.metadata import ApiServerPods
from kubeapi import kube_api_server
from support import need_binary

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml"))
KUBERNETES = "1.37.0"


def _parses(argv: list[str]) -> None:
    """The arguments a unit, a manifest or the image runs are a valid gpuscope command line."""
    build_parser().parse_args(argv)


def _unit_lines(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_unit_verifies_and_is_hardened(unit: Path, tmp_path: Path) -> None:
    analyze = need_binary("systemd-analyze", "systemd")
    # verify needs ExecStart's binary to exist: point it at this environment's gpuscope
    gpuscope = Path(sys.executable).parent / "gpuscope"
    assert gpuscope.exists(), gpuscope
    local = tmp_path / unit.name
    local.write_text(unit.read_text().replace("/usr/local/bin/gpuscope", str(gpuscope)))
    verify = subprocess.run(
        [analyze, "verify", "--man=no", str(local)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert verify.returncode == 0 and not (verify.stdout + verify.stderr).strip(), (
        verify.stdout + verify.stderr
    )
    security = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=30", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert security.returncode == 0, security.stdout[-2000:]  # exposure 3.0 or better ("OK")
    keys = _unit_lines(unit)
    assert keys["User"] == "gpuscope" and keys["StateDirectory"].startswith("gpuscope")
    assert keys["Restart"] in ("on-failure", "always") and keys["NoNewPrivileges"] == "yes"
    env = {"GPUSCOPE_HUB": "http://hub:7470", "STATE_DIRECTORY": "/var/lib/gpuscope-agent"}
    command = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], keys["ExecStart"])
    _parses(shlex.split(command)[1:])


def test_a_broken_unit_is_caught(tmp_path: Path) -> None:
    analyze = need_binary("systemd-analyze", "systemd")
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/nonexistent/gpuscope hub\nRestartt=always\n")
    verify = subprocess.run(
        [analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert "Restartt" in verify.stdout + verify.stderr and verify.returncode != 0


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize(
    ("path", "doc"), _documents(), ids=lambda v: v.name if isinstance(v, Path) else v.get("kind", "")
)
def test_manifest_matches_the_kubernetes_schema(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validator_refuses_a_typo() -> None:
    (doc,) = [d for p, d in _documents() if d["kind"] == "DaemonSet"]
    broken = copy.deepcopy(doc)
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def _containers(kind: str) -> list[dict[str, Any]]:
    return [
        c for _, d in _documents() if d["kind"] == kind for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_agent_daemonset_sees_the_host_and_the_hub_is_a_statefulset() -> None:
    (agent,) = [d for _, d in _documents() if d["kind"] == "DaemonSet"]
    volumes = {
        v["name"]: v.get("hostPath", {}).get("path") for v in agent["spec"]["template"]["spec"]["volumes"]
    }
    assert {"/proc", "/sys", "/dev/kmsg", "/var/lib/kubelet/pod-resources"} <= set(volumes.values())
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "nvidia.com/gpu" not in str(container["resources"])  # the agent takes no GPU from the scheduler
    hubs = [
        d for _, d in _documents() if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "gpuscope-hub"
    ]
    assert len(hubs) == 1 and hubs[0]["spec"]["volumeClaimTemplates"]
    for container in _containers("DaemonSet") + _containers("StatefulSet"):
        if container["image"].startswith("ghcr.io/gpuscope/"):
            assert container["image"].endswith(f":{__version__}")
            _parses([a.replace("$(NODE_NAME)", "node-1") for a in container["args"]])


def test_hub_configs_in_the_manifests_pass_config_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCOPE_TOKEN", "a-token-the-secret-would-hold")  # listen 0.0.0.0 needs one
    configs = [
        d.get("data", d.get("stringData"))["hub.yaml"]
        for _, d in _documents()
        if d["kind"] in ("ConfigMap", "Secret") and "hub.yaml" in d.get("data", d.get("stringData", {}))
    ]
    assert len(configs) == 2
    for i, text in enumerate(configs):
        path = tmp_path / f"hub-{i}.yaml"
        path.write_text(text)
        assert check_config(path)


def test_containerfile_installs_the_pinned_hub_as_a_user() -> None:
    text = (ROOT / "Containerfile").read_text()
    assert "--constraint constraints.txt '.[hub]'" in text and "USER 10001" in text
    assert f'org.opencontainers.image.version="{__version__}"' in text
    assert re.search(r'^ENTRYPOINT \["gpuscope"\]$', text, re.MULTILINE)
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.MULTILINE)
    _parses(yaml.safe_load(cmd))


# --- the agent's RBAC: what the code calls, derived by running it ----------------------------------

_POD = {
    "metadata": {
        "name": "api-7d4b9c6f8-x2x2x",
        "namespace": "serving",
        "uid": "0f1e2d3c-4b5a-4968-8778-695a4b3c2d1e",
        "labels": {"team": "search"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "api-7d4b9c6f8", "controller": True}],
    }
}
_REPLICASET = {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "api", "controller": True}]}}


def _api_calls() -> list[tuple[str, str]]:
    """Run the agent's API-server client (gpuscope.kube.metadata) against a local server that records
    every request: ``[(method, path with query)]``."""

    def answer(path: str, authorization: str | None) -> tuple[int, bytes]:
        return 200, json.dumps(_REPLICASET if "/replicasets/" in path else {"items": [_POD]}).encode()

    with kube_api_server(answer) as (url, seen):
        api = ApiServerPods(url, "token")
        try:
            meta = api.node_pods("gpu-1")
        finally:
            api.close()
    assert meta["serving/api-7d4b9c6f8-x2x2x"].workload == "Deployment/api"  # every call was made
    return [("GET", path) for path in seen]  # the server answers GET only


def rbac_need(method: str, url: str) -> tuple[str, str, str]:
    """``(apiGroup, resource, verb)`` a request needs, by the Kubernetes API's URL layout
    (``/api/v1/[namespaces/<ns>/]<resource>[/<name>]``, ``/apis/<group>/<version>/...``)."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    if segs[:2] == ["api", "v1"]:
        group, rest = "", segs[2:]
    elif segs[0] == "apis" and len(segs) >= 3:
        group, rest = segs[1], segs[3:]
    else:
        raise AssertionError(f"not a Kubernetes API path: {url}")
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    assert method == "GET", f"{method} {url}: only reads are expected of the agent"
    watch = parse_qs(parts.query).get("watch") == ["true"]
    return group, resource, "get" if named else "watch" if watch else "list"


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _allows(granted: set[tuple[str, str, str]], need: tuple[str, str, str]) -> bool:
    return any(all(have in (want, "*") for have, want in zip(g, need, strict=True)) for g in granted)


def test_the_agents_service_account_may_make_exactly_the_api_calls_the_code_makes() -> None:
    (agent,) = [d for _, d in _documents() if d["kind"] == "DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    account, namespace = spec["serviceAccountName"], agent["metadata"]["namespace"]
    (container,) = spec["containers"]
    assert "--kube-api" in container["args"] and spec.get("automountServiceAccountToken") is True
    socket = container["args"][container["args"].index("--kubelet-socket") + 1]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert os.path.dirname(socket) in mounts  # the kubelet's pod-resources socket is in the agent's view
    accounts = [d["metadata"]["name"] for _, d in _documents() if d["kind"] == "ServiceAccount"]
    assert account in accounts
    roles = {d["metadata"]["name"]: d for _, d in _documents() if d["kind"] == "ClusterRole"}
    granted: set[tuple[str, str, str]] = set()
    for _, binding in _documents():
        subjects = binding.get("subjects") or []
        if (
            binding["kind"] == "ClusterRoleBinding"
            and {
                "kind": "ServiceAccount",
                "name": account,
                "namespace": namespace,
            }
            in subjects
        ):
            assert binding["roleRef"]["kind"] == "ClusterRole"
            granted |= _grants(roles[binding["roleRef"]["name"]]["rules"])
    needed = {rbac_need(method, url) for method, url in _api_calls()}
    assert needed == {("", "pods", "list"), ("apps", "replicasets", "get")}  # what the client does today
    missing = [n for n in needed if not _allows(granted, n)]
    assert not missing, f"the agent's ClusterRole lacks {missing}"
    assert granted == needed, f"the ClusterRole grants more than the agent calls: {granted - needed}"


def test_rbac_needs_follow_the_kubernetes_url_layout() -> None:
    assert rbac_need("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn") == ("", "pods", "list")
    assert rbac_need("GET", "/api/v1/namespaces/ml/pods/trainer-0") == ("", "pods", "get")
    assert rbac_need("GET", "/api/v1/nodes/gpu-1") == ("", "nodes", "get")
    assert rbac_need("GET", "/apis/apps/v1/namespaces/ml/replicasets/rs-1") == ("apps", "replicasets", "get")
    assert rbac_need("GET", "/api/v1/pods?watch=true") == ("", "pods", "watch")
    assert not _allows({("", "pods", "get")}, ("", "pods", "list"))
    assert _allows({("", "*", "list")}, ("", "pods", "list"))
