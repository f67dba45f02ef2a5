"""Who uses a GPU: the job, pod and container of a process, from procfs.

A GPU's samples carry the job using it (DESIGN §2 attribution labels), found from the processes
NVML lists on it: the Slurm job id from the environment or the cgroup path (``job_1234``), the
Kubernetes pod UID and container id from the cgroup path (the ``pod`` label becomes ``namespace/name``
where :class:`gpuscope.collect.podresources.PodNames` resolves the UID, which stays as ``pod_uid``),
the torchrun run id and rank from the environment; the job key is the one the SDK and
dcgm-exporter use (:func:`gpuscope.identity.job_key`).
An unreadable process (gone, or not ours to read) simply yields fewer labels.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpuscope.identity import job_key

#: ``.../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`` (systemd driver) or
#: ``/kubepods/burstable/pod<uid>/<id>`` (cgroupfs driver)
_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_CONTAINER = re.compile(
    r"(?:docker|cri-containerd|crio|containerd)-([0-9a-f]{12,64})\.scope|/([0-9a-f]{64})(?:/|$)"
)
_SLURM = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    job: str | None = None
    #: ``namespace/name`` once resolved; until then the pod's UID, which is all the cgroup says
    pod: str | None = None
    container: str | None = None
    rank: str | None = None
    namespace: str | None = None
    pod_uid: str | None = None
    #: the process's ``HOSTNAME``: in a pod, the pod's name unless the pod sets another
    hostname: str | None = None

    def labels(self) -> dict[str, str]:
        """The attribution labels (``job``, ``pod``, ``namespace``, ``container``) that are known."""
        out = {"job": self.job, "pod": self.pod, "namespace": self.namespace, "container": self.container}
        return {k: v for k, v in out.items() if v}


def parse_cgroup(text: str) -> tuple[str | None, str | None, str | None]:
    """``(slurm job, pod uid, container id)`` from the text of ``/proc/<pid>/cgroup``."""
    job = pod = container = None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if job is None and (m := _SLURM.search(path)):
            job = m.group(1)
        if pod is None and (m := _POD.search(path)):
            pod = m.group(1).replace("_", "-")
        if container is None and (m := _CONTAINER.search(path)):
            container = (m.group(1) or m.group(2))[:12]
    return job, pod, container


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ``: NUL-separated ``KEY=value`` pairs."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def process_owner(pid: int, proc_root: str = "/proc") -> ProcessOwner:
    """The job, pod, container and rank of ``pid``, as far as procfs tells."""
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "cgroup"), encoding="utf-8", errors="replace") as fh:
            cg_job, pod, container = parse_cgroup(fh.read())
    except OSError:
        cg_job = pod = container = None
    try:
        with open(os.path.join(base, "environ"), "rb") as fh:
            env = parse_environ(fh.read())
    except OSError:
        env = {}
    job = job_key(env) or cg_job
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    return ProcessOwner(
        job=job, pod=pod, container=container, rank=rank, pod_uid=pod, hostname=env.get("HOSTNAME") or None
    )
