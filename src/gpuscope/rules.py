"""One home per alert rule (DESIGN §3): its name, tier, owner, layer, whether it is hard, what it
means and the share of work it puts at risk.

Detectors, the simulator's fault kinds, the alert engine, playbooks, dashboards and the rule
reference in docs/rules.md (``gpuscope.docgen``) all read this table, so a rule's facts cannot
disagree between them.
Rule names are a contract relied on outside the repository.

Tiers: P1 loses or corrupts work · P2 wastes GPU-hours or user experience · P3 develops over days.
``work_at_risk`` is the cost basis: the cost of an hour of delay is
``affected_gpus x price_per_gpu_hour x work_at_risk`` (a lost GPU stops all of its work, 1.0; a
correctable-error trend threatens a little, 0.05). A ``hard`` rule fires without a pending time:
the time-to-detect budget (p50 <= 5 s, p95 <= 15 s) applies to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Tier = Literal["P1", "P2", "P3"]
#: gravest first
TIERS: tuple[Tier, ...] = ("P1", "P2", "P3")
Owner = Literal["platform", "model", "serving", "product"]
#: ``platform``: gpuscope itself and the scheduler around the jobs
Layer = Literal["hardware", "training", "serving", "quality", "platform"]


@dataclass(frozen=True, slots=True)
class Stages:
    """When a held condition of the rule has grown materially worse while its alert is open: a
    stage of worsening (:mod:`gpuscope.detect.worsening`), which the alert layer tells again. Its
    level (a ratio, 1 being no slowdown) at least :meth:`bar` times the level last told, for ``hold``
    seconds."""

    #: how long the grown level must last (seconds)
    hold: float
    #: a fixed growth (1.25: a quarter worse); NaN: measured against the signal's own noise
    growth: float = math.nan
    #: a bar measured against noise: this many times the level's own spread (a share of it) ...
    noise_k: float = 3.0
    #: ... and at least this share: noise that quiet is not a material change
    floor: float = 0.08

    def bar(self, spread: float = math.nan) -> float:
        """The growth that is a stage, for a level whose own spread (a share of the level, as the
        detector measures it on the signal) is ``spread``."""
        if math.isfinite(self.growth):
            return self.growth
        return 1.0 + max(self.floor, self.noise_k * spread if math.isfinite(spread) else 0.0)


@dataclass(frozen=True, slots=True)
class RuleSpec:
    name: str
    tier: Tier
    owner: Owner
    work_at_risk: float
    layer: Layer
    hard: bool
    meaning: str
    #: a standing condition, not a live fault (a placement since the job started): it is the root
    #: cause of an incident only when no live fault shares it (:mod:`gpuscope.alert.incidents`)
    standing: bool = False
    #: how a held condition grows worse by stages (None: it does not, or not by a level)
    stages: Stages | None = None


GPU_XID_FATAL = "gpu_xid_fatal"
GPU_XID_APP = "gpu_xid_app"
GPU_ECC_UNCORRECTABLE = "gpu_ecc_uncorrectable"
GPU_ECC_CORRECTABLE_RISING = "gpu_ecc_correctable_rising"
GPU_LOST = "gpu_lost"
GPU_THERMAL_THROTTLE = "gpu_thermal_throttle"
GPU_POWER_THROTTLE = "gpu_power_throttle"
GPU_UNDERPERFORMING = "gpu_underperforming"
GPU_FAILURE_RISK = "gpu_failure_risk"
NVLINK_ERRORS = "nvlink_errors"
PCIE_REPLAY_RISING = "pcie_replay_rising"
NETWORK_DEGRADED = "network_degraded"
NODE_UNREACHABLE = "node_unreachable"
GPU_IDLE_ALLOCATED = "gpu_idle_allocated"
JOB_FAILED = "job_failed"
TRAINING_STALLED = "training_stalled"
RANK_LOST = "rank_lost"
TRAINING_STRAGGLER = "training_straggler"
SLOW_PLACEMENT = "slow_placement"
STEP_TIME_REGRESSION = "step_time_regression"
LOSS_NAN = "loss_nan"
LOSS_SPIKE = "loss_spike"
LOSS_DIVERGENCE = "loss_divergence"
LOSS_PLATEAU = "loss_plateau"
GRAD_NORM_EXPLOSION = "grad_norm_explosion"
GRADIENT_SKEW = "gradient_skew"
CHECKPOINT_FAILED = "checkpoint_failed"
CHECKPOINT_CORRUPT = "checkpoint_corrupt"
CHECKPOINT_OVERDUE = "checkpoint_overdue"
MEMORY_FRAGMENTATION = "memory_fragmentation"
INFERENCE_LATENCY_REGRESSION = "inference_latency_regression"
INFERENCE_TTFT_REGRESSION = "inference_ttft_regression"
INFERENCE_ERROR_RATE = "inference_error_rate"
INFERENCE_QUEUE_BUILDUP = "inference_queue_buildup"
KV_CACHE_PRESSURE = "kv_cache_pressure"
PREDICTION_DRIFT = "prediction_drift"
CONFIDENCE_SHIFT = "confidence_shift"
INPUT_DRIFT = "input_drift"
BUSINESS_METRIC_DROP = "business_metric_drop"
VERSION_REGRESSION = "version_regression"
JOB_PENDING_TOO_LONG = "job_pending_too_long"
HUB_OVERLOADED = "hub_overloaded"


def _table(*specs: RuleSpec) -> dict[str, RuleSpec]:
    out: dict[str, RuleSpec] = {}
    for s in specs:
        if s.name in out:
            raise ValueError(f"rule {s.name!r} is defined twice")
        out[s.name] = s
    return out


RULES: dict[str, RuleSpec] = _table(
    RuleSpec(
        GPU_XID_FATAL,
        "P1",
        "platform",
        1.0,
        "hardware",
        True,
        "The driver reported an XID that needs a GPU reset or a node reboot.",
    ),
    RuleSpec(
        GPU_XID_APP,
        "P3",
        "model",
        0.1,
        "hardware",
        False,
        "An application-class XID: a CUDA kernel faulted (bad address, illegal instruction) or was killed.",
    ),
    RuleSpec(
        GPU_ECC_UNCORRECTABLE,
        "P1",
        "platform",
        1.0,
        "hardware",
        True,
        "An uncorrectable (double-bit) memory error: data in GPU memory is suspect.",
    ),
    RuleSpec(
        GPU_ECC_CORRECTABLE_RISING,
        "P3",
        "platform",
        0.05,
        "hardware",
        False,
        "Corrected (single-bit) ECC errors are rising above this GPU's baseline and its peers.",
    ),
    RuleSpec(
        GPU_LOST,
        "P1",
        "platform",
        1.0,
        "hardware",
        True,
        "The GPU fell off the bus or stopped answering NVML.",
    ),
    RuleSpec(
        GPU_THERMAL_THROTTLE,
        "P2",
        "platform",
        0.3,
        "hardware",
        False,
        "The GPU's clocks are held down by temperature under load.",
        # its SM clock under load (the median of the last ``recent`` seconds) the bar lower than
        # when the alert was told, the bar measured on the clock's own spread as the alert opened
        stages=Stages(hold=30.0, noise_k=3.0, floor=0.1),
    ),
    RuleSpec(
        GPU_POWER_THROTTLE,
        "P2",
        "platform",
        0.3,
        "hardware",
        False,
        "The GPU's clocks are held down by a power cap or power brake under load.",
    ),
    RuleSpec(
        GPU_UNDERPERFORMING,
        "P2",
        "platform",
        0.3,
        "hardware",
        False,
        "The GPU is slower than its peers doing the same work: it slowed down, or it has run 10 % or more "
        "slower than its speed group since it started (a faulty part, not a slower bin).",
    ),
    RuleSpec(
        GPU_FAILURE_RISK,
        # P2 (the finding escalates) once the score is imminent: the GPU is about to fail under its job
        "P3",
        "platform",
        0.1,
        "hardware",
        False,
        "A composite failure-risk score (ECC trend, throttling, peer lag, XIDs) is high; P2 when it "
        "reaches the imminent level (the GPU is about to take its work down with it).",
    ),
    RuleSpec(
        NVLINK_ERRORS,
        "P2",
        "platform",
        0.3,
        "hardware",
        False,
        "NVLink CRC, replay or recovery errors are above baseline.",
    ),
    RuleSpec(
        PCIE_REPLAY_RISING,
        "P3",
        "platform",
        0.05,
        "hardware",
        False,
        "PCIe replays are rising above baseline.",
    ),
    RuleSpec(
        NETWORK_DEGRADED,
        "P2",
        "platform",
        0.3,
        "hardware",
        False,
        "InfiniBand symbol/receive errors, a link down, or a TCP retransmit spike on the node.",
    ),
    RuleSpec(
        NODE_UNREACHABLE, "P1", "platform", 1.0, "hardware", True, "The node's agent stopped reporting."
    ),
    RuleSpec(
        GPU_IDLE_ALLOCATED,
        "P2",
        "platform",
        1.0,
        "training",
        False,
        "GPUs allocated to a job have been idle for long.",
    ),
    RuleSpec(
        JOB_FAILED,
        "P1",
        "model",
        1.0,
        "training",
        False,
        "A job's processes exited abnormally without finishing.",
    ),
    RuleSpec(
        TRAINING_STALLED,
        "P1",
        "model",
        1.0,
        "training",
        False,
        "The job's step counter stopped advancing against its baseline step time.",
    ),
    RuleSpec(RANK_LOST, "P1", "platform", 1.0, "training", True, "A rank's heartbeat stopped."),
    RuleSpec(
        TRAINING_STRAGGLER,
        "P2",
        "platform",
        0.3,
        "training",
        False,
        "One rank is slower than the median of its peers (in a two-rank job: than the other, and the "
        "job slowed), sustained.",
        # its slowdown (1 + how far behind) a quarter again over the one told, for as long as it
        # took to flag it
        stages=Stages(hold=30.0, growth=1.25),
    ),
    RuleSpec(
        SLOW_PLACEMENT,
        "P3",
        "platform",
        # the finding carries the share it measured: the slow group's lag / (1 + lag) of every GPU
        # (a slow GPU: its clock lag behind its group)
        0.2,
        "training",
        False,
        "A group of ranks, or one GPU against the others of its speed group (by less than 10 %: past "
        "that it is a faulty part, gpu_underperforming), has been slower than the rest of the job since "
        "it started (mixed hardware, a slower bin or placement); the job runs at their pace. Reported "
        "once, not a live fault; its cost is the share of the job's GPU time lost.",
        standing=True,
    ),
    RuleSpec(
        STEP_TIME_REGRESSION,
        "P2",
        "model",
        0.3,
        "training",
        False,
        "The job's step time shifted materially above its rolling baseline: by 8 %, or three times the "
        "job's own minute-to-minute wander where that is more; smaller shifts and slow drifts are not.",
        # the recent pace the material bar of its start above the pace told (its wander as the
        # condition began), for as long as it took to fire
        stages=Stages(hold=30.0, noise_k=3.0, floor=0.08),
    ),
    RuleSpec(LOSS_NAN, "P1", "model", 1.0, "training", False, "The loss became NaN or infinite."),
    RuleSpec(
        LOSS_SPIKE, "P2", "model", 0.3, "training", False, "The loss jumped far above its rolling baseline."
    ),
    RuleSpec(LOSS_DIVERGENCE, "P2", "model", 0.5, "training", False, "The loss trends upward."),
    RuleSpec(
        LOSS_PLATEAU, "P3", "model", 0.2, "training", False, "The loss stopped improving over a long window."
    ),
    RuleSpec(
        GRAD_NORM_EXPLOSION,
        "P2",
        "model",
        0.5,
        "training",
        False,
        "The gradient norm jumped far above its baseline.",
    ),
    RuleSpec(GRADIENT_SKEW, "P2", "model", 0.3, "training", False, "Gradient norms disagree across ranks."),
    RuleSpec(
        CHECKPOINT_FAILED,
        "P1",
        "model",
        1.0,
        "training",
        False,
        "A checkpoint save failed or not every rank completed it.",
    ),
    RuleSpec(
        CHECKPOINT_CORRUPT,
        "P1",
        "model",
        1.0,
        "training",
        False,
        "A checkpoint failed integrity verification.",
    ),
    RuleSpec(
        CHECKPOINT_OVERDUE,
        "P1",
        "model",
        1.0,
        "training",
        False,
        "No good checkpoint within several expected intervals.",
    ),
    RuleSpec(
        MEMORY_FRAGMENTATION,
        "P2",
        "model",
        0.2,
        "training",
        False,
        "Allocator fragmentation or retries are rising: the job is heading for an out-of-memory error.",
    ),
    RuleSpec(
        INFERENCE_LATENCY_REGRESSION,
        "P2",
        "serving",
        0.5,
        "serving",
        False,
        "Request latency is above its baseline.",
        # its recent median (the last 20 s, or its last few updates) the bar above the level told,
        # the bar measured on the series' own noise before the alert (its mean absolute log
        # deviation), at least a shift as large as the one the rule fires on (1.3x)
        stages=Stages(hold=30.0, noise_k=3.0, floor=0.3),
    ),
    RuleSpec(
        INFERENCE_TTFT_REGRESSION,
        "P2",
        "serving",
        0.5,
        "serving",
        False,
        "Time to first token is above its baseline.",
    ),
    RuleSpec(
        INFERENCE_ERROR_RATE,
        "P1",
        "serving",
        1.0,
        "serving",
        False,
        "Errors burn the error budget fast (multi-window burn rate).",
    ),
    RuleSpec(
        INFERENCE_QUEUE_BUILDUP,
        "P2",
        "serving",
        0.5,
        "serving",
        False,
        "Requests queue up: the service is saturated.",
    ),
    RuleSpec(
        KV_CACHE_PRESSURE,
        # P2 (the finding escalates) when latency or time to first token moved with it: users feel it
        "P3",
        "serving",
        0.3,
        "serving",
        False,
        "The KV cache is fuller, or preempts more, than at the service's own operating point; P2 when "
        "latency or time to first token moves with it (users feel the preemptions).",
    ),
    RuleSpec(
        PREDICTION_DRIFT,
        "P3",
        "model",
        0.1,
        "quality",
        False,
        "The prediction distribution drifted from its reference.",
    ),
    RuleSpec(
        CONFIDENCE_SHIFT,
        "P3",
        "model",
        0.1,
        "quality",
        False,
        "The confidence distribution shifted from its reference.",
    ),
    RuleSpec(
        INPUT_DRIFT,
        "P3",
        "model",
        0.1,
        "quality",
        False,
        "Input feature distributions drifted from the reference.",
    ),
    RuleSpec(
        BUSINESS_METRIC_DROP,
        "P2",
        "product",
        0.5,
        "quality",
        False,
        "A downstream business metric for the service fell below its baseline.",
    ),
    RuleSpec(
        VERSION_REGRESSION,
        "P2",
        "model",
        0.5,
        "serving",
        False,
        "Latency or quality regressed starting at a model version promotion.",
    ),
    RuleSpec(
        JOB_PENDING_TOO_LONG,
        "P2",
        "platform",
        0.3,
        "platform",
        False,
        "A job has waited in the scheduler's queue far longer than its partition's usual wait.",
    ),
    RuleSpec(
        HUB_OVERLOADED,
        "P2",
        "platform",
        0.0,
        "platform",
        False,
        "The hub cannot keep up with what its senders offer (its oldest ingest request waited past its "
        "budget, or its evaluation loop ran late) and sheds new batches with 503 and Retry-After.",
    ),
)


def spec(rule: str) -> RuleSpec:
    """The entry of a rule; unknown names are a programming error."""
    return RULES[rule]


def standing(rule: str) -> bool:
    """Is ``rule`` a standing condition rather than a live fault? Unknown names (alerts from
    outside) are live faults."""
    known = RULES.get(rule)
    return known is not None and known.standing


def stages_of(rule: str) -> Stages:
    """The stage bar of ``rule``, for a detector that tells its stages of worsening."""
    stages = RULES[rule].stages
    if stages is None:
        raise ValueError(f"rule {rule!r} has no stages of worsening")
    return stages


def rules_of(layer: Layer) -> frozenset[str]:
    """The rules of one layer (dashboards and checks group alerts by it)."""
    return frozenset(name for name, s in RULES.items() if s.layer == layer)
