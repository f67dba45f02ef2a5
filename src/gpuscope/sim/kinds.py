"""The fault kinds of DESIGN §4: what each one targets, its parameters with defaults, and its rule.

The parser validates scenario files against this table and the simulator looks up effects by the
same names, so a kind cannot be accepted by one and unknown to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuscope.rules import (
    BUSINESS_METRIC_DROP,
    CHECKPOINT_CORRUPT,
    CHECKPOINT_FAILED,
    CHECKPOINT_OVERDUE,
    CONFIDENCE_SHIFT,
    GPU_ECC_CORRECTABLE_RISING,
    GPU_ECC_UNCORRECTABLE,
    GPU_FAILURE_RISK,
    GPU_IDLE_ALLOCATED,
    GPU_LOST,
    GPU_POWER_THROTTLE,
    GPU_THERMAL_THROTTLE,
    GPU_UNDERPERFORMING,
    GPU_XID_APP,
    GPU_XID_FATAL,
    GRAD_NORM_EXPLOSION,
    GRADIENT_SKEW,
    INFERENCE_ERROR_RATE,
    INFERENCE_LATENCY_REGRESSION,
    INFERENCE_QUEUE_BUILDUP,
    INFERENCE_TTFT_REGRESSION,
    INPUT_DRIFT,
    JOB_FAILED,
    KV_CACHE_PRESSURE,
    LOSS_DIVERGENCE,
    LOSS_NAN,
    LOSS_PLATEAU,
    LOSS_SPIKE,
    MEMORY_FRAGMENTATION,
    NETWORK_DEGRADED,
    NODE_UNREACHABLE,
    NVLINK_ERRORS,
    PCIE_REPLAY_RISING,
    PREDICTION_DRIFT,
    RANK_LOST,
    RULES,
    SLOW_PLACEMENT,
    STEP_TIME_REGRESSION,
    TRAINING_STALLED,
    TRAINING_STRAGGLER,
    VERSION_REGRESSION,
)
from gpuscope.signals import APP_XIDS

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
        GPU_XID_FATAL,
        GPU_TARGET,
        code=Param(79, 1, 999, help="XID code; fatal codes kill the rank, 79 drops the GPU off the bus"),
    ),
    _k(
        "ecc_dbe",
        GPU_ECC_UNCORRECTABLE,
        GPU_TARGET,
        count=Param(1, 1, 1000, help="uncorrectable errors reported"),
    ),
    _k(
        "ecc_sbe_storm",
        GPU_ECC_CORRECTABLE_RISING,
        GPU_TARGET,
        rate=Param(20.0, 0.01, 1e6, help="corrected errors per second"),
    ),
    _k(
        "gpu_lost",
        GPU_LOST,
        GPU_TARGET,
        reason=Param("GPU is lost (NVML_ERROR_GPU_IS_LOST)", help="reason in the gpu_lost event"),
    ),
    _k(
        "thermal_throttle",
        GPU_THERMAL_THROTTLE,
        GPU_TARGET,
        temp=Param(90.0, 80.0, 105.0, help="temperature the GPU climbs to, Celsius"),
    ),
    _k(
        "power_throttle",
        GPU_POWER_THROTTLE,
        GPU_TARGET,
        cap=Param(0.55, 0.2, 0.95, help="enforced power as a fraction of the limit (mode cap)"),
        mode=Param("cap", choices=("cap", "brake"), help="software power cap or external power brake"),
    ),
    _k(
        "gpu_slow",
        GPU_UNDERPERFORMING,
        GPU_TARGET,
        slowdown=Param(1.25, 1.01, 10.0, help="how much slower than its peers"),
    ),
    _k(
        "gpu_failure_risk",
        GPU_FAILURE_RISK,
        GPU_TARGET,
        ramp=Param(3600.0, 60.0, 7 * 86400.0, help="seconds from the first symptoms to the fatal XID"),
        sbe_rate=Param(0.2, 0.001, 1e4, help="corrected errors per second reached at the end"),
        rows=Param(8, 1, 512, help="rows remapped over the ramp"),
        temp=Param(92.0, 80.0, 105.0, help="temperature of the throttle episodes, Celsius"),
        code=Param(79, 1, 999, help="the fatal XID that ends it"),
    ),
    _k(
        "nvlink_errors",
        NVLINK_ERRORS,
        GPU_TARGET,
        rate=Param(30.0, 0.01, 1e6, help="CRC errors per second"),
        links_down=Param(0, 0, 18, help="links that drop to inactive"),
    ),
    _k(
        "pcie_replay",
        PCIE_REPLAY_RISING,
        GPU_TARGET,
        rate=Param(5.0, 0.01, 1e6, help="PCIe replays per second"),
    ),
    _k(
        "network_degraded",
        NETWORK_DEGRADED,
        NODE_TARGET,
        retrans_ratio=Param(0.04, 0.0, 1.0, help="TCP retransmitted / sent segments"),
        ib_error_rate=Param(20.0, 0.0, 1e6, help="InfiniBand symbol + receive errors per second"),
        slowdown=Param(1.2, 1.0, 10.0, help="step-time factor of training jobs on the node"),
    ),
    _k("node_down", NODE_UNREACHABLE, NODE_TARGET),
    _k("idle_allocation", GPU_IDLE_ALLOCATED, JOB_TARGET),
    _k("training_hang", TRAINING_STALLED, JOB_TARGET, "training"),
    _k(
        "job_crash",
        JOB_FAILED,
        JOB_TARGET,
        reason=Param("RuntimeError: CUDA error: an illegal memory access was encountered"),
        exit_code=Param(1, -255, 255),
    ),
    _k(
        "rank_dropout",
        RANK_LOST,
        RANK_TARGET,
        "training",
        exit_code=Param(-9, -255, 255, help="exit status of the dead rank process (-9: killed)"),
    ),
    _k(
        "straggler",
        TRAINING_STRAGGLER,
        RANK_TARGET,
        "training",
        slowdown=Param(1.3, 1.01, 10.0, help="compute-time factor of the slow rank"),
    ),
    _k(
        "straggler_worsening",
        TRAINING_STRAGGLER,
        RANK_TARGET,
        "training",
        slowdown=Param(1.2, 1.01, 10.0, help="compute-time factor of the slow rank at onset"),
        worsen=Param(3.0, 1.0, 10.0, help="further factor it slows by, worsen_after seconds after onset"),
        worsen_after=Param(600.0, 0.0, 1e7, help="seconds after onset the straggler worsens"),
    ),
    _k(
        "slow_placement",
        SLOW_PLACEMENT,
        JOB_TARGET,
        "training",
        slowdown=Param(1.3, 1.01, 10.0, help="compute-time factor of the slow group"),
        first_rank=Param(0, 0, 1_000_000, help="first rank of the slow group"),
        ranks=Param(2, 2, 1_000_000, help="how many ranks, from first_rank on, are in the slow group"),
        clocks=Param(False, help="the slow group's GPUs run at lower SM clocks (slower parts, clock limits)"),
    ),
    _k(
        "step_time_regression",
        STEP_TIME_REGRESSION,
        JOB_TARGET,
        "training",
        factor=Param(1.3, 1.01, 10.0, help="step-time factor"),
    ),
    _k("loss_nan", LOSS_NAN, JOB_TARGET, "training"),
    _k(
        "loss_spike",
        LOSS_SPIKE,
        JOB_TARGET,
        "training",
        factor=Param(3.0, 1.1, 100.0, help="loss multiplier at the peak"),
        decay_steps=Param(40.0, 1.0, 1e6, help="steps for the spike to decay by e"),
    ),
    _k(
        "loss_divergence",
        LOSS_DIVERGENCE,
        JOB_TARGET,
        "training",
        rate=Param(0.05, 0.001, 10.0, help="relative loss increase per minute"),
    ),
    _k("loss_plateau", LOSS_PLATEAU, JOB_TARGET, "training"),
    _k(
        "grad_explosion",
        GRAD_NORM_EXPLOSION,
        JOB_TARGET,
        "training",
        factor=Param(30.0, 1.5, 1e6, help="gradient-norm multiplier"),
    ),
    _k(
        "gradient_skew",
        GRADIENT_SKEW,
        RANK_TARGET,
        "training",
        factor=Param(5.0, 1.5, 1e6, help="gradient-norm multiplier of the rank"),
    ),
    _k(
        "checkpoint_failure",
        CHECKPOINT_FAILED,
        JOB_TARGET,
        "training",
        reason=Param("OSError: [Errno 28] No space left on device"),
        all_ranks=Param(False, help="every rank fails, not only the last one"),
    ),
    _k("checkpoint_corrupt", CHECKPOINT_CORRUPT, JOB_TARGET, "training"),
    _k("checkpoint_stop", CHECKPOINT_OVERDUE, JOB_TARGET, "training"),
    _k(
        "memory_fragmentation",
        MEMORY_FRAGMENTATION,
        RANK_TARGET,
        "training",
        rate=Param(0.03, 0.001, 1.0, help="fragmentation ratio gained per minute"),
    ),
    _k(
        "latency_spike",
        INFERENCE_LATENCY_REGRESSION,
        SERVICE_TARGET,
        factor=Param(3.0, 1.1, 100.0, help="latency multiplier"),
    ),
    _k(
        "ttft_regression",
        INFERENCE_TTFT_REGRESSION,
        SERVICE_TARGET,
        factor=Param(3.0, 1.1, 100.0, help="time-to-first-token multiplier"),
    ),
    _k(
        "error_burst",
        INFERENCE_ERROR_RATE,
        SERVICE_TARGET,
        error_rate=Param(0.2, 0.001, 1.0, help="fraction of requests that fail"),
    ),
    _k(
        "queue_buildup",
        INFERENCE_QUEUE_BUILDUP,
        SERVICE_TARGET,
        overload=Param(1.4, 1.01, 100.0, help="demand over the capacity left"),
    ),
    _k(
        "kv_cache_pressure",
        KV_CACHE_PRESSURE,
        SERVICE_TARGET,
        usage=Param(0.98, 0.5, 1.0, help="KV-cache usage ratio"),
    ),
    _k(
        "bad_version",
        VERSION_REGRESSION,
        SERVICE_TARGET,
        version=Param("", help="version promoted (default: the next one)"),
        latency_factor=Param(1.6, 1.0, 100.0),
        error_rate=Param(0.02, 0.0, 1.0, help="extra fraction of requests that fail"),
    ),
    _k(
        "prediction_drift",
        PREDICTION_DRIFT,
        SERVICE_TARGET,
        shift=Param(0.3, 0.05, 1.0, help="share of predictions moved to one class"),
    ),
    _k(
        "confidence_shift",
        CONFIDENCE_SHIFT,
        SERVICE_TARGET,
        shift=Param(-0.8, -5.0, 5.0, help="change of the confidence logit (negative: less sure)"),
    ),
    _k(
        "input_drift",
        INPUT_DRIFT,
        SERVICE_TARGET,
        factor=Param(1.6, 0.05, 20.0, help="prompt length multiplier"),
    ),
    _k(
        "business_drop",
        BUSINESS_METRIC_DROP,
        SERVICE_TARGET,
        factor=Param(0.7, 0.0, 0.95, help="business metric multiplier"),
    ),
)

FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in _KINDS}


def rule_for_fault(kind: str, params: dict[str, object] | None = None) -> str:
    """The rule a fault must raise; an ``xid`` maps by its code (default 79, fatal)."""
    if kind == "xid":
        code = (params or {}).get("code", 79)
        return GPU_XID_APP if isinstance(code, int) and code in APP_XIDS else GPU_XID_FATAL
    return FAULT_KINDS[kind].rule


#: Hard faults: their rule fires at once, and the time-to-detect budget applies to them.
HARD_FAULTS: frozenset[str] = frozenset(name for name, kind in FAULT_KINDS.items() if RULES[kind.rule].hard)
