"""Playbook text per rule: Impact, Diagnosis (ordered), Mitigation. Data only; the meaning of a
rule is in :mod:`gpuscope.rules`.

A diagnosis step that data can answer names a check (:mod:`gpuscope.alert.checks`); the check runs
when the alert fires and its result is attached to the alert. Steps without a check are for the
person on call, in the order worth doing them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Step:
    text: str
    check: str | None = None


@dataclass(frozen=True, slots=True)
class Playbook:
    impact: str
    diagnosis: tuple[Step, ...]
    mitigation: tuple[str, ...]


S = Step
_HW_NEARBY = S("Other hardware faults on the same node in the last minutes", "faults_nearby")
_RELATED = S("Other alerts firing on the same node, job or service", "related_alerts")
_GPU_STATE = S("The GPU's latest temperature, power, clocks and error counters", "gpu_state")
_JOB_UTIL = S("GPU utilization of the job's GPUs: busy or idle", "job_gpu_utilization")
_CKPT = S("Time since the job's last verified checkpoint (work at risk)", "last_checkpoint")
_FIRST_RANK = S("The rank that stopped first", "first_stopped_rank")
_STEP_TREND = S("Step time and loss over the last minutes against the run so far", "training_trend")
_VERSION = S("A model version promoted on the service shortly before", "recent_promotion")
_SERVICE = S("The service's latency, errors, queue and KV cache against their recent level", "service_state")

PLAYBOOKS: dict[str, Playbook] = {
    "gpu_xid_fatal": Playbook(
        "Every job on this GPU has lost its work since the last checkpoint and cannot continue here.",
        (
            S("The XID code, its count and when it first appeared", "alert_details"),
            _HW_NEARBY,
            S("Jobs and ranks placed on this GPU", "workloads_on_gpu"),
            S("Kernel log (dmesg) around the XID for the full message"),
        ),
        (
            "Drain the node from the scheduler",
            "Reset the GPU (nvidia-smi -r) or reboot; RMA if it recurs",
            "Restart affected jobs from their last verified checkpoint on healthy nodes",
        ),
    ),
    "gpu_xid_app": Playbook(
        "Usually one process crashed; the GPU itself is healthy.",
        (
            S("The XID code and the process/job on the GPU", "alert_details"),
            S("Jobs and ranks placed on this GPU", "workloads_on_gpu"),
            S("Application logs of the job at that time (out-of-bounds access, bad kernel)"),
        ),
        ("Hand to the job owner with the XID code", "Escalate to platform only if it repeats across jobs"),
    ),
    "gpu_ecc_uncorrectable": Playbook(
        "Results computed since the error may be silently wrong; the process touching it is usually killed.",
        (_GPU_STATE, S("Jobs and ranks placed on this GPU", "workloads_on_gpu"), _HW_NEARBY),
        (
            "Drain the GPU; reset so row remapping takes effect",
            "Replace the GPU if remapping failed or errors recur",
            "Restart jobs from a checkpoint written before the error",
        ),
    ),
    "gpu_ecc_correctable_rising": Playbook(
        "No data lost yet; a rising trend often precedes an uncorrectable error.",
        (_GPU_STATE, _RELATED),
        ("Schedule a GPU reset at the next maintenance window", "Open an RMA ticket if the trend continues"),
    ),
    "gpu_lost": Playbook(
        "Every job using this GPU is stalled or dead; collectives on its peers hang.",
        (S("Jobs and ranks placed on this GPU", "workloads_on_gpu"), _HW_NEARBY, _GPU_STATE),
        (
            "Drain the node; reboot (a lost GPU needs a cold reset)",
            "Check PCIe seating, power and cooling; RMA if it recurs",
            "Restart affected jobs from their last verified checkpoint elsewhere",
        ),
    ),
    "gpu_thermal_throttle": Playbook(
        "The GPU runs slower; a synchronous job runs at the pace of its slowest GPU.",
        (_GPU_STATE, S("Temperature of this GPU against its node peers", "gpu_vs_peers"), _RELATED),
        (
            "Check fans, airflow and inlet temperature of the node",
            "Reseat or replace the heatsink if isolated",
        ),
    ),
    "gpu_power_throttle": Playbook(
        "The GPU runs slower than its peers, slowing jobs that synchronize with it.",
        (_GPU_STATE, S("Power of this GPU against its node peers", "gpu_vs_peers"), _RELATED),
        ("Check the configured power limit (nvidia-smi -q -d POWER)", "Check PSU and rack power budget"),
    ),
    "gpu_underperforming": Playbook(
        "The whole job waits for it at every collective.",
        (_GPU_STATE, S("This GPU against its node peers", "gpu_vs_peers"), _RELATED),
        ("Move the rank off this GPU", "Reset the GPU; run diagnostics (dcgmi diag -r 3)"),
    ),
    "gpu_failure_risk": Playbook(
        "No loss yet; this GPU is likely to fail and take a job down with it.",
        (_GPU_STATE, _HW_NEARBY),
        ("Drain at the next maintenance window and run diagnostics",),
    ),
    "nvlink_errors": Playbook(
        "Collectives slow down or hang; data may be retransmitted repeatedly.",
        (_GPU_STATE, _HW_NEARBY, _RELATED),
        ("Drain the node and run NVLink diagnostics", "Reseat the baseboard/NVSwitch tray if errors persist"),
    ),
    "pcie_replay_rising": Playbook(
        "Host-device transfers slow; often an early sign of a link or riser problem.",
        (_GPU_STATE, _HW_NEARBY),
        ("Check link width/speed (lspci -vv)", "Reseat the GPU at the next window"),
    ),
    "network_degraded": Playbook(
        "Collectives and data loading slow down; inference on the node may see latency.",
        (_RELATED, S("Jobs and services running on this node", "workloads_on_node")),
        ("Check the port and cable (ibstat, perfquery)", "Move latency-sensitive work off the node"),
    ),
    "node_unreachable": Playbook(
        "Either the node is down (its jobs are lost) or monitoring is blind there.",
        (S("Jobs and services running on this node", "workloads_on_node"), _HW_NEARBY, _RELATED),
        ("Check the node out of band (BMC, ping)", "If down: drain it and restart its jobs elsewhere"),
    ),
    "hub_overloaded": Playbook(
        "Nothing is lost (senders spool what was refused and send it again), but alerts come "
        "late, and while this fires the hub raises no node_unreachable, rank_lost or "
        "training_stalled for senders it may itself be holding back.",
        (
            S("The hub's overload status: oldest wait, requests in flight and shed", "alert_details"),
            S("Host CPU and memory of the hub: is it starved by other processes?"),
            S("Senders per hub and samples per second against the sizing in docs/scaling.md"),
        ),
        (
            "Give the hub CPU (other processes off its host) or move to a larger host",
            "Split the fleet over more hubs (cluster mode) or lower the agents' interval",
        ),
    ),
    "gpu_idle_allocated": Playbook(
        "GPU-hours are paid for and wasted; others wait for them.",
        (_JOB_UTIL, S("The job's training progress", "training_trend"), _RELATED),
        ("Ask the job owner to release or fix the job", "Enforce an idle reclaim policy in the scheduler"),
    ),
    "job_failed": Playbook(
        "All work since the last checkpoint is lost and the GPUs sit idle until restarted.",
        (S("The reported reason and exit code", "alert_details"), _HW_NEARBY, _CKPT, _FIRST_RANK),
        (
            "If a hardware fault explains it, exclude that node and restart",
            "Restart from the last verified checkpoint",
        ),
    ),
    "job_pending_too_long": Playbook(
        "Its work is not being done; a stuck queue (drained nodes, a job that never fits) holds others too.",
        (S("The pending reason and how long it waited", "alert_details"), _RELATED),
        (
            "Check the reason: Resources or Priority means demand exceeds capacity; ReqNodeNotAvail, "
            "PartitionDown or a drained node means capacity is missing",
            "Resume or repair drained nodes, or resize or requeue the job",
        ),
    ),
    "training_stalled": Playbook(
        "Every GPU of the job is burning money without progress; work since the last checkpoint is at risk.",
        (_JOB_UTIL, _CKPT, _HW_NEARBY, _FIRST_RANK, S("Stack traces of the ranks (py-spy dump) for a hang")),
        (
            "If a GPU or rank was lost: exclude its node and restart from the last verified checkpoint",
            "If busy but stuck in a collective: dump stacks, then restart",
            "If idle: check the data pipeline and storage",
        ),
    ),
    "rank_lost": Playbook(
        "The job cannot make progress without it; the other ranks will hang in their next collective.",
        (S("Last step and heartbeat of the rank", "alert_details"), _HW_NEARBY, _CKPT),
        ("Check the rank's process and node", "Restart the job from its last verified checkpoint"),
    ),
    "training_straggler": Playbook(
        "The whole job runs at the pace of this rank.",
        (S("The GPU this rank runs on", "gpu_state"), _HW_NEARBY, _STEP_TREND),
        ("Move the rank off the slow GPU/node", "Check data loading skew on that rank"),
    ),
    "slow_placement": Playbook(
        "The whole job runs at the pace of its slowest group of ranks or GPU, from its first step.",
        (S("The slow GPU, or the GPUs the slow ranks run on", "gpu_state"), _HW_NEARBY, _STEP_TREND),
        (
            "Place the job on one kind of GPU and one fabric at the next restart",
            "Check the slow GPU or group's nodes for a lower clock, power cap or PCIe/NVLink width",
            "Drain a GPU that is slow in every job it runs and have it checked (application clocks, cooling)",
        ),
    ),
    "step_time_regression": Playbook(
        "The job takes longer and costs more per step.",
        (_STEP_TREND, _JOB_UTIL, _HW_NEARBY),
        ("Check recent code/config changes and data loading", "Check for throttled or slow GPUs in the job"),
    ),
    "loss_nan": Playbook(
        "Every further step is wasted and may overwrite good checkpoints.",
        (_STEP_TREND, _CKPT, S("Gradient norm before the NaN"), S("Mixed precision loss scaling")),
        (
            "Stop the job before it checkpoints NaN weights",
            "Resume from the last good checkpoint with a lower LR",
        ),
    ),
    "loss_spike": Playbook(
        "Training may recover or diverge; recent steps may be wasted.",
        (_STEP_TREND, S("The data batch at the spike"), S("Gradient norm at the spike")),
        ("Watch for recovery; roll back to the last checkpoint if it does not", "Skip the offending batch"),
    ),
    "loss_divergence": Playbook(
        "The run is getting worse; continuing wastes GPU-hours.",
        (
            _STEP_TREND,
            S("Data pipeline (shuffling, corrupted shards)"),
            S("Optimizer state"),
            S("Learning-rate schedule"),
        ),
        ("Roll back to the last good checkpoint", "Lower the learning rate or fix the data"),
    ),
    "loss_plateau": Playbook(
        "GPU-hours spent without learning.",
        (_STEP_TREND, S("Learning-rate schedule"), S("Evaluation metrics")),
        ("Decide with the model owner whether to stop or change the schedule",),
    ),
    "grad_norm_explosion": Playbook(
        "The next steps may diverge or produce NaN.",
        (_STEP_TREND, S("Gradient clipping settings"), S("Learning-rate schedule")),
        ("Enable or lower gradient clipping", "Roll back and lower the learning rate"),
    ),
    "gradient_skew": Playbook(
        "Ranks may be training on different data or one has corrupt state.",
        (_STEP_TREND, S("The GPU of the skewed rank", "gpu_state"), S("Data sharding per rank")),
        ("Check the skewed rank's data shard and GPU", "Restart from a checkpoint if state diverged"),
    ),
    "checkpoint_failed": Playbook(
        "Work since the last good checkpoint is unprotected.",
        (S("The failure reason", "alert_details"), _CKPT, _HW_NEARBY),
        ("Check storage capacity and health", "Trigger a new checkpoint once storage is fixed"),
    ),
    "checkpoint_corrupt": Playbook(
        "A restore from it would fail or load bad weights.",
        (S("The verification result", "alert_details"), _CKPT),
        ("Mark the checkpoint bad so it is never restored", "Trigger a fresh checkpoint; check storage"),
    ),
    "checkpoint_overdue": Playbook(
        "Work at risk grows every minute: a crash now loses everything since the last one.",
        (_CKPT, S("Checkpoint save errors", "alert_details"), _JOB_UTIL),
        ("Trigger a checkpoint now", "Fix the checkpoint path (storage, permissions, callbacks)"),
    ),
    "memory_fragmentation": Playbook(
        "An OOM kills the job and loses work since the last checkpoint.",
        (_STEP_TREND, S("The rank's GPU memory", "gpu_state")),
        ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "Checkpoint and restart to defragment"),
    ),
    "inference_latency_regression": Playbook(
        "Users wait longer; SLOs burn.",
        (
            _SERVICE,
            _VERSION,
            S("GPU memory pressure or network errors on the service's nodes", "related_alerts"),
        ),
        ("Roll back a recent version", "Scale out or shed load", "Move off a degraded node"),
    ),
    "inference_ttft_regression": Playbook(
        "Interactive users see the model as slow to answer.",
        (_SERVICE, _VERSION, S("Prefill load and queueing on the service's nodes", "related_alerts")),
        ("Scale out prefill capacity", "Roll back a recent version"),
    ),
    "inference_error_rate": Playbook(
        "Users get failed requests now.",
        (_SERVICE, _VERSION, _RELATED),
        ("Roll back a recent version", "Fail over to a healthy replica"),
    ),
    "inference_queue_buildup": Playbook(
        "Latency grows for everyone; timeouts follow.",
        (_SERVICE, _RELATED),
        ("Scale out replicas", "Shed or rate-limit low-priority traffic"),
    ),
    "kv_cache_pressure": Playbook(
        "Throughput drops and latency rises as requests are recomputed.",
        (_SERVICE, _RELATED),
        ("Lower max concurrent sequences or context length", "Add replicas or GPU memory"),
    ),
    "prediction_drift": Playbook(
        "Model decisions may no longer be what was validated.",
        (S("Input distributions", "service_state"), S("Recent retraining"), _VERSION),
        ("Review with the model owner; retrain or roll back",),
    ),
    "confidence_shift": Playbook(
        "The model may be less certain (new inputs) or over-confident (a bug).",
        (S("Input distributions", "service_state"), S("Recent retraining"), _VERSION),
        ("Review with the model owner",),
    ),
    "input_drift": Playbook(
        "Predictions are made on data unlike the training data.",
        (S("Input distributions", "service_state"), S("Upstream data pipeline changes"), _VERSION),
        ("Fix the upstream pipeline or retrain on recent data",),
    ),
    "business_metric_drop": Playbook(
        "Revenue or user outcomes are affected now.",
        (_SERVICE, _VERSION, _RELATED),
        ("Roll back a recent version", "Involve the product owner"),
    ),
    "version_regression": Playbook(
        "Every request served by the new version is affected.",
        (_VERSION, _SERVICE),
        ("Roll back to the previous version", "Compare the versions offline"),
    ),
}
