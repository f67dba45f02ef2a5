"""The fault kinds of DESIGN §4: what each one targets, its parameters with defaults, and its rule.

The parser validates scenario files against this table and the simulator looks up effects by the
same names, so a kind cannot be accepted by one and unknown to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ParamValue = float | int | str | bool

GPU_TARGET = ("node", "gpu")
NODE_TARGET = ("node",)
JOB_TARGET = ("job",)
RANK_TARGET = ("job", "rank")
SERVICE_TARGET = ("service",)


@dataclass(frozen=True, slots=True)
class Param:
    """One fault parameter: its type, default and allowed range or choices."""

    default: ParamValue
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""

    @property
    def type(self) -> type:
        return type(self.default)


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    rule: str
    target: tuple[str, ...]
    params: dict[str, Param] = field(default_factory=dict)
    #: "training" or "inference" when the targeted job must be of that kind; None for any job
    job_kind: str | None = None
    #: False for kinds that are accepted (ground truth for scoring) but have no signals yet
    simulated: bool = True


def _k(
    name: str,
    rule: str,
    target: tuple[str, ...],
    job_kind: str | None = None,
    simulated: bool = True,
    **params: Param,
) -> FaultKind:
    return FaultKind(name, rule, target, dict(params), job_kind, simulated)


_KINDS = (
    _k(
        "xid",
        "gpu_xid_fatal",
        GPU_TARGET,
        code=Param(79, 1, 999, help="XID code; fatal codes kill the rank, 79 drops the GPU off the bus"),
    ),
    _k(
        "ecc_dbe",
        "gpu_ecc_uncorrectable",
        GPU_TARGET,
        count=Param(1, 1, 1000, help="uncorrectable errors reported"),
    ),
    _k(
        "ecc_sbe_storm",
        "gpu_ecc_correctable_rising",
        GPU_TARGET,
        rate=Param(20.0, 0.01, 1e6, help="corrected errors per second"),
    ),
    _k(
        "gpu_lost",
        "gpu_lost",
        GPU_TARGET,
        reason=Param("GPU is lost (NVML_ERROR_GPU_IS_LOST)", help="reason in the gpu_lost event"),
    ),
    _k(
        "thermal_throttle",
        "gpu_thermal_throttle",
        GPU_TARGET,
        temp=Param(90.0, 80.0, 105.0, help="temperature the GPU climbs to, Celsius"),
    ),
    _k(
        "power_throttle",
        "gpu_power_throttle",
        GPU_TARGET,
        cap=Param(0.55, 0.2, 0.95, help="enforced power as a fraction of the limit (mode cap)"),
        mode=Param("cap", choices=("cap", "brake"), help="software power cap or external power brake"),
    ),
    _k(
        "gpu_slow",
        "gpu_underperforming",
        GPU_TARGET,
        slowdown=Param(1.25, 1.01, 10.0, help="how much slower than its peers"),
    ),
    _k(
        "nvlink_errors",
        "nvlink_errors",
        GPU_TARGET,
        rate=Param(30.0, 0.01, 1e6, help="CRC errors per second"),
        links_down=Param(0, 0, 18, help="links that drop to inactive"),
    ),
    _k(
        "pcie_replay",
        "pcie_replay_rising",
        GPU_TARGET,
        rate=Param(5.0, 0.01, 1e6, help="PCIe replays per second"),
    ),
    _k(
        "network_degraded",
        "network_degraded",
        NODE_TARGET,
        retrans_ratio=Param(0.04, 0.0, 1.0, help="TCP retransmitted / sent segments"),
        ib_error_rate=Param(20.0, 0.0, 1e6, help="InfiniBand symbol + receive errors per second"),
        slowdown=Param(1.2, 1.0, 10.0, help="step-time factor of training jobs on the node"),
    ),
    _k("node_down", "node_unreachable", NODE_TARGET),
    _k("idle_allocation", "gpu_idle_allocated", JOB_TARGET),
    _k("training_hang", "training_stalled", JOB_TARGET, "training"),
    _k(
        "job_crash",
        "job_failed",
        JOB_TARGET,
        reason=Param("RuntimeError: CUDA error: an illegal memory access was encountered"),
        exit_code=Param(1, -255, 255),
    ),
    _k(
        "rank_dropout",
        "rank_lost",
        RANK_TARGET,
        "training",
        exit_code=Param(-9, -255, 255, help="exit status of the dead rank process (-9: killed)"),
    ),
    _k(
        "straggler",
        "training_straggler",
        RANK_TARGET,
        "training",
        slowdown=Param(1.3, 1.01, 10.0, help="compute-time factor of the slow rank"),
    ),
    _k(
        "step_time_regression",
        "step_time_regression",
        JOB_TARGET,
        "training",
        factor=Param(1.3, 1.01, 10.0, help="step-time factor"),
    ),
    _k("loss_nan", "loss_nan", JOB_TARGET, "training"),
    _k(
        "loss_spike",
        "loss_spike",
        JOB_TARGET,
        "training",
        factor=Param(3.0, 1.1, 100.0, help="loss multiplier at the peak"),
        decay_steps=Param(40.0, 1.0, 1e6, help="steps for the spike to decay by e"),
    ),
    _k(
        "loss_divergence",
        "loss_divergence",
        JOB_TARGET,
        "training",
        rate=Param(0.05, 0.001, 10.0, help="relative loss increase per minute"),
    ),
    _k("loss_plateau", "loss_plateau", JOB_TARGET, "training"),
    _k(
        "grad_explosion",
        "grad_norm_explosion",
        JOB_TARGET,
        "training",
        factor=Param(30.0, 1.5, 1e6, help="gradient-norm multiplier"),
    ),
    _k(
        "gradient_skew",
        "gradient_skew",
        RANK_TARGET,
        "training",
        factor=Param(5.0, 1.5, 1e6, help="gradient-norm multiplier of the rank"),
    ),
    _k(
        "checkpoint_failure",
        "checkpoint_failed",
        JOB_TARGET,
        "training",
        reason=Param("OSError: [Errno 28] No space left on device"),
        all_ranks=Param(False, help="every rank fails, not only the last one"),
    ),
    _k("checkpoint_corrupt", "checkpoint_corrupt", JOB_TARGET, "training"),
    _k("checkpoint_stop", "checkpoint_overdue", JOB_TARGET, "training"),
    _k(
        "memory_fragmentation",
        "memory_fragmentation",
        RANK_TARGET,
        "training",
        rate=Param(0.03, 0.001, 1.0, help="fragmentation ratio gained per minute"),
    ),
    _k(
        "latency_spike",
        "inference_latency_regression",
        SERVICE_TARGET,
        factor=Param(3.0, 1.1, 100.0, help="latency multiplier"),
    ),
    _k(
        "ttft_regression",
        "inference_ttft_regression",
        SERVICE_TARGET,
        factor=Param(3.0, 1.1, 100.0, help="time-to-first-token multiplier"),
    ),
    _k(
        "error_burst",
        "inference_error_rate",
        SERVICE_TARGET,
        error_rate=Param(0.2, 0.001, 1.0, help="fraction of requests that fail"),
    ),
    _k(
        "queue_buildup",
        "inference_queue_buildup",
        SERVICE_TARGET,
        overload=Param(1.4, 1.01, 100.0, help="demand over the capacity left"),
    ),
    _k(
        "kv_cache_pressure",
        "kv_cache_pressure",
        SERVICE_TARGET,
        usage=Param(0.98, 0.5, 1.0, help="KV-cache usage ratio"),
    ),
    _k(
        "bad_version",
        "version_regression",
        SERVICE_TARGET,
        version=Param("", help="version promoted (default: the next one)"),
        latency_factor=Param(1.6, 1.0, 100.0),
        error_rate=Param(0.02, 0.0, 1.0, help="extra fraction of requests that fail"),
    ),
    _k(
        "prediction_drift",
        "prediction_drift",
        SERVICE_TARGET,
        shift=Param(0.3, 0.05, 1.0, help="share of predictions moved to one class"),
    ),
    _k(
        "confidence_shift",
        "confidence_shift",
        SERVICE_TARGET,
        shift=Param(-0.8, -5.0, 5.0, help="change of the confidence logit (negative: less sure)"),
    ),
    _k(
        "input_drift",
        "input_drift",
        SERVICE_TARGET,
        factor=Param(1.6, 0.05, 20.0, help="prompt length multiplier"),
    ),
    _k(
        "business_drop",
        "business_metric_drop",
        SERVICE_TARGET,
        factor=Param(0.7, 0.0, 0.95, help="business metric multiplier"),
    ),
)

FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in _KINDS}
