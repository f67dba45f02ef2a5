"""The alert catalog of DESIGN §3: each rule's tier, owner and the share of work it puts at risk.

Rule names are a contract relied on outside the repository. ``work_at_risk`` scales the cost of
delay: a lost GPU stops all of its work (1.0); a correctable-error trend threatens a little (0.05).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.signals import APP_XIDS


@dataclass(frozen=True, slots=True)
class RuleSpec:
    name: str
    tier: str  # P1 loses or corrupts work · P2 wastes GPU-hours or user experience · P3 develops over days
    owner: str  # platform, model, serving, product
    work_at_risk: float
    meaning: str


def _rules(*rows: tuple[str, str, str, float, str]) -> dict[str, RuleSpec]:
    return {r[0]: RuleSpec(*r) for r in rows}


RULES: dict[str, RuleSpec] = _rules(
    ("gpu_xid_fatal", "P1", "platform", 1.0, "The driver reported an XID that needs a GPU reset or reboot"),
    ("gpu_xid_app", "P3", "model", 0.1, "An application-class XID: a kernel faulted or was killed"),
    (
        "gpu_ecc_uncorrectable",
        "P1",
        "platform",
        1.0,
        "Uncorrectable memory error: data on the GPU is suspect",
    ),
    ("gpu_ecc_correctable_rising", "P3", "platform", 0.05, "Corrected ECC errors rising above baseline"),
    ("gpu_lost", "P1", "platform", 1.0, "The GPU vanished from the bus or stopped answering NVML"),
    ("gpu_thermal_throttle", "P2", "platform", 0.3, "Clocks held down by temperature under load"),
    ("gpu_power_throttle", "P2", "platform", 0.3, "Clocks held down by a power cap or brake under load"),
    ("gpu_underperforming", "P2", "platform", 0.3, "GPU slower than its peers doing the same work"),
    ("gpu_failure_risk", "P3", "platform", 0.1, "Composite failure risk score is high"),
    ("nvlink_errors", "P2", "platform", 0.3, "NVLink error rate above baseline"),
    ("pcie_replay_rising", "P3", "platform", 0.05, "PCIe replays rising above baseline"),
    ("network_degraded", "P2", "platform", 0.3, "Fabric or TCP errors degrade the node's network"),
    ("node_unreachable", "P1", "platform", 1.0, "The node's agent stopped reporting"),
    ("gpu_idle_allocated", "P2", "platform", 1.0, "GPUs allocated to a job sit idle"),
    ("job_failed", "P1", "model", 1.0, "A job exited abnormally without finishing"),
    (
        "job_pending_too_long",
        "P2",
        "platform",
        0.3,
        "A job has waited in the scheduler's queue far longer than its partition's usual wait",
    ),
    ("training_stalled", "P1", "model", 1.0, "The job's step counter stopped advancing"),
    ("rank_lost", "P1", "platform", 1.0, "A rank's heartbeat stopped"),
    ("training_straggler", "P2", "platform", 0.3, "One rank is slower than its peers and holds the job back"),
    ("step_time_regression", "P2", "model", 0.3, "The job's step time shifted above its baseline"),
    ("loss_nan", "P1", "model", 1.0, "The loss became NaN or infinite"),
    ("loss_spike", "P2", "model", 0.3, "The loss jumped far above its rolling baseline"),
    ("loss_divergence", "P2", "model", 0.5, "The loss trends upward"),
    ("loss_plateau", "P3", "model", 0.2, "The loss stopped improving"),
    ("grad_norm_explosion", "P2", "model", 0.5, "The gradient norm jumped far above its baseline"),
    ("gradient_skew", "P2", "model", 0.3, "Gradient norms disagree across ranks"),
    ("checkpoint_failed", "P1", "model", 1.0, "A checkpoint save failed or not every rank completed it"),
    ("checkpoint_corrupt", "P1", "model", 1.0, "A checkpoint failed integrity verification"),
    ("checkpoint_overdue", "P1", "model", 1.0, "No good checkpoint within several expected intervals"),
    ("memory_fragmentation", "P2", "model", 0.2, "Allocator fragmentation or retries rising: OOM risk"),
    ("inference_latency_regression", "P2", "serving", 0.5, "Request latency above its baseline"),
    ("inference_ttft_regression", "P2", "serving", 0.5, "Time to first token above its baseline"),
    ("inference_error_rate", "P1", "serving", 1.0, "Errors burn the error budget fast"),
    ("inference_queue_buildup", "P2", "serving", 0.5, "Requests queue up: the service is saturated"),
    ("kv_cache_pressure", "P2", "serving", 0.3, "KV cache near full, requests preempted"),
    ("prediction_drift", "P3", "model", 0.1, "Prediction distribution drifted from the reference"),
    ("confidence_shift", "P3", "model", 0.1, "Confidence distribution shifted from the reference"),
    ("input_drift", "P3", "model", 0.1, "Input feature distribution drifted from the reference"),
    ("business_metric_drop", "P2", "product", 0.5, "A business metric fell below its baseline"),
    ("version_regression", "P2", "model", 0.5, "A regression began at a model version promotion"),
    (
        "hub_overloaded",
        "P2",
        "platform",
        0.0,
        "The hub is behind on its own ingest and sheds senders' batches with Retry-After",
    ),
)


def spec(rule: str) -> RuleSpec:
    """The catalog entry of a rule; unknown names are a programming error."""
    return RULES[rule]


#: The rule each injected fault kind must raise (DESIGN §4). ``xid`` depends on the code.
FAULT_RULES: dict[str, str] = {
    "ecc_dbe": "gpu_ecc_uncorrectable",
    "ecc_sbe_storm": "gpu_ecc_correctable_rising",
    "gpu_lost": "gpu_lost",
    "thermal_throttle": "gpu_thermal_throttle",
    "power_throttle": "gpu_power_throttle",
    "gpu_slow": "gpu_underperforming",
    "nvlink_errors": "nvlink_errors",
    "pcie_replay": "pcie_replay_rising",
    "network_degraded": "network_degraded",
    "node_down": "node_unreachable",
    "idle_allocation": "gpu_idle_allocated",
    "training_hang": "training_stalled",
    "job_crash": "job_failed",
    "rank_dropout": "rank_lost",
    "straggler": "training_straggler",
    "step_time_regression": "step_time_regression",
    "loss_nan": "loss_nan",
    "loss_spike": "loss_spike",
    "loss_divergence": "loss_divergence",
    "loss_plateau": "loss_plateau",
    "grad_explosion": "grad_norm_explosion",
    "gradient_skew": "gradient_skew",
    "checkpoint_failure": "checkpoint_failed",
    "checkpoint_corrupt": "checkpoint_corrupt",
    "checkpoint_stop": "checkpoint_overdue",
    "memory_fragmentation": "memory_fragmentation",
    "latency_spike": "inference_latency_regression",
    "ttft_regression": "inference_ttft_regression",
    "error_burst": "inference_error_rate",
    "queue_buildup": "inference_queue_buildup",
    "kv_cache_pressure": "kv_cache_pressure",
    "prediction_drift": "prediction_drift",
    "confidence_shift": "confidence_shift",
    "input_drift": "input_drift",
    "business_drop": "business_metric_drop",
    "bad_version": "version_regression",
}
FAULT_KINDS: frozenset[str] = frozenset({"xid", *FAULT_RULES})

#: Hard faults: the time-to-detect budget (p50 <= 5 s, p95 <= 15 s) applies to these.
HARD_FAULTS: frozenset[str] = frozenset({"xid", "ecc_dbe", "gpu_lost", "node_down", "rank_dropout"})


def rule_for_fault(kind: str, params: dict[str, object] | None = None) -> str:
    """The rule a fault must raise; an ``xid`` maps by its code (default 79, fatal)."""
    if kind == "xid":
        code = (params or {}).get("code", 79)
        return "gpu_xid_app" if isinstance(code, int) and code in APP_XIDS else "gpu_xid_fatal"
    return FAULT_RULES[kind]
