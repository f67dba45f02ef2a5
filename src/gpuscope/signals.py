"""The vocabulary of gpuscope: standard metric names, event kinds and training metrics.

Collectors, the simulator, the SDKs and the detectors all name signals from here, so a detector
written against the simulator reads real NVML data unchanged. Names are snake_case with units
(DESIGN §2). Counters end in ``_total`` and are cumulative; detectors take their rates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: str  # "gauge" or "counter"
    help: str


def _specs(*rows: tuple[str, str, str]) -> dict[str, MetricSpec]:
    return {name: MetricSpec(name, kind, text) for name, kind, text in rows}


#: Per-GPU telemetry; entity labels: node, gpu (index as string), uuid; attribution: job.
GPU_METRICS = _specs(
    ("gpu_utilization_percent", "gauge", "Percent of time a kernel was running on the GPU"),
    ("gpu_sm_active_ratio", "gauge", "Fraction of SMs with at least one warp resident (DCGM SM activity)"),
    ("gpu_sm_occupancy_ratio", "gauge", "Resident warps over the maximum (DCGM SM occupancy)"),
    ("gpu_tensor_active_ratio", "gauge", "Fraction of cycles the tensor pipes were active"),
    ("gpu_dram_active_ratio", "gauge", "Fraction of cycles the device memory interface was active"),
    ("gpu_memory_utilization_percent", "gauge", "Percent of time device memory was read or written"),
    ("gpu_memory_used_bytes", "gauge", "Framebuffer memory in use"),
    ("gpu_memory_free_bytes", "gauge", "Framebuffer memory free"),
    ("gpu_memory_reserved_bytes", "gauge", "Framebuffer memory reserved by the driver"),
    ("gpu_memory_total_bytes", "gauge", "Framebuffer memory in total"),
    ("gpu_temp_celsius", "gauge", "GPU die temperature"),
    ("gpu_memory_temp_celsius", "gauge", "HBM temperature"),
    ("gpu_power_watts", "gauge", "Power draw"),
    ("gpu_power_limit_watts", "gauge", "Enforced power limit"),
    ("gpu_energy_joules_total", "counter", "Energy consumed since the driver loaded"),
    ("gpu_sm_clock_mhz", "gauge", "SM clock"),
    ("gpu_memory_clock_mhz", "gauge", "Memory clock"),
    ("gpu_clock_event_reasons", "gauge", "Bitmask of NVML clock event (throttle) reasons"),
    ("gpu_throttle_sw_power", "gauge", "1 while clocks are held down by the software power cap"),
    ("gpu_throttle_hw_slowdown", "gauge", "1 while the hardware slowdown is engaged"),
    ("gpu_throttle_sw_thermal", "gauge", "1 while the software thermal slowdown is engaged"),
    ("gpu_throttle_hw_thermal", "gauge", "1 while the hardware thermal slowdown is engaged"),
    ("gpu_throttle_hw_power_brake", "gauge", "1 while the external power brake is engaged"),
    ("gpu_violation_power_seconds_total", "counter", "Time clocks were limited by power"),
    ("gpu_violation_thermal_seconds_total", "counter", "Time clocks were limited by temperature"),
    ("gpu_ecc_sbe_volatile_total", "counter", "Corrected (single-bit) ECC errors since the last reset"),
    ("gpu_ecc_dbe_volatile_total", "counter", "Uncorrected (double-bit) ECC errors since the last reset"),
    ("gpu_ecc_sbe_aggregate_total", "counter", "Corrected ECC errors over the GPU's life"),
    ("gpu_ecc_dbe_aggregate_total", "counter", "Uncorrected ECC errors over the GPU's life"),
    ("gpu_retired_pages_sbe", "gauge", "Pages retired for corrected errors"),
    ("gpu_retired_pages_dbe", "gauge", "Pages retired for uncorrected errors"),
    ("gpu_retired_pages_pending", "gauge", "1 when a page retirement waits for a reset"),
    ("gpu_remapped_rows_correctable", "gauge", "Rows remapped for corrected errors"),
    ("gpu_remapped_rows_uncorrectable", "gauge", "Rows remapped for uncorrected errors"),
    ("gpu_remapped_rows_pending", "gauge", "1 when a row remap waits for a reset"),
    ("gpu_remapped_rows_failure", "gauge", "1 when a row remap failed"),
    ("gpu_pcie_tx_bytes_per_second", "gauge", "PCIe transmit throughput"),
    ("gpu_pcie_rx_bytes_per_second", "gauge", "PCIe receive throughput"),
    ("gpu_pcie_replay_total", "counter", "PCIe replay counter"),
    ("gpu_nvlink_tx_bytes_per_second", "gauge", "NVLink transmit throughput, all links"),
    ("gpu_nvlink_rx_bytes_per_second", "gauge", "NVLink receive throughput, all links"),
    ("gpu_nvlink_crc_errors_total", "counter", "NVLink CRC flit and data errors, all links"),
    ("gpu_nvlink_replay_errors_total", "counter", "NVLink replay errors, all links"),
    ("gpu_nvlink_recovery_errors_total", "counter", "NVLink recovery errors, all links"),
    ("gpu_nvlink_links_down", "gauge", "NVLink links not in the active state"),
)

#: Per-node telemetry; entity labels: node.
NODE_METRICS = _specs(
    ("node_cpu_percent", "gauge", "Host CPU utilisation over all cores"),
    ("node_load1", "gauge", "One-minute load average"),
    ("node_memory_used_bytes", "gauge", "Host memory in use"),
    ("node_memory_total_bytes", "gauge", "Host memory in total"),
    ("node_disk_used_ratio", "gauge", "Fraction of the root filesystem in use"),
    ("node_net_rx_bytes_per_second", "gauge", "Network receive throughput, all interfaces"),
    ("node_net_tx_bytes_per_second", "gauge", "Network transmit throughput, all interfaces"),
    ("node_tcp_out_segs_total", "counter", "TCP segments sent"),
    ("node_tcp_retrans_segs_total", "counter", "TCP segments retransmitted"),
    ("node_ib_rx_bytes_per_second", "gauge", "InfiniBand/RoCE receive throughput, all ports"),
    ("node_ib_tx_bytes_per_second", "gauge", "InfiniBand/RoCE transmit throughput, all ports"),
    ("node_ib_symbol_errors_total", "counter", "InfiniBand symbol errors, all ports"),
    ("node_ib_rcv_errors_total", "counter", "InfiniBand receive errors, all ports"),
    ("node_ib_link_downed_total", "counter", "InfiniBand link-downed events, all ports"),
    ("node_ib_ports_down", "gauge", "InfiniBand ports not in the ACTIVE state"),
)

#: Per-service inference telemetry; entity labels: service, model, version (and node).
SERVICE_METRICS = _specs(
    ("inference_requests_per_second", "gauge", "Requests completed per second"),
    ("inference_errors_per_second", "gauge", "Requests failed per second"),
    ("inference_latency_p50_seconds", "gauge", "End-to-end latency, median"),
    ("inference_latency_p95_seconds", "gauge", "End-to-end latency, 95th percentile"),
    ("inference_latency_p99_seconds", "gauge", "End-to-end latency, 99th percentile"),
    ("inference_ttft_p95_seconds", "gauge", "Time to first token, 95th percentile"),
    ("inference_itl_p95_seconds", "gauge", "Inter-token latency, 95th percentile"),
    ("inference_queue_depth", "gauge", "Requests waiting"),
    ("inference_running_requests", "gauge", "Requests being served"),
    ("inference_batch_size", "gauge", "Mean batch size"),
    ("inference_kv_cache_usage_ratio", "gauge", "Fraction of the KV cache in use"),
    ("inference_preemptions_total", "counter", "Requests preempted for KV cache space"),
    ("inference_requests_total", "counter", "Requests completed"),
    ("inference_errors_total", "counter", "Requests failed"),
    ("inference_ttft_p50_seconds", "gauge", "Time to first token, median"),
    ("inference_ttft_p99_seconds", "gauge", "Time to first token, 99th percentile"),
    ("inference_itl_p50_seconds", "gauge", "Inter-token latency, median"),
    ("inference_itl_p99_seconds", "gauge", "Inter-token latency, 99th percentile"),
    ("inference_kv_cache_capacity_blocks", "gauge", "KV cache size in blocks (engine's own unit)"),
    ("inference_memory_kv_cache_bytes", "gauge", "GPU memory held by the KV cache"),
    ("inference_memory_weights_bytes", "gauge", "GPU memory held by the model weights"),
)

#: Model quality and error budgets, derived on the hub (gpuscope.quality); labels service, model,
#: version, and feature / metric / slo / window where they apply.
QUALITY_METRICS = _specs(
    ("model_prediction_drift_score", "gauge", "Drift of predictions from the reference window"),
    ("model_confidence_drift_score", "gauge", "Drift of confidence scores from the reference window"),
    ("model_input_drift_score", "gauge", "Drift of one input feature from the reference window"),
    ("model_prediction_drifted", "gauge", "1 when the prediction drift test rejects no-drift"),
    ("model_confidence_drifted", "gauge", "1 when the confidence drift test rejects no-drift"),
    ("model_input_drifted", "gauge", "1 when the input drift test rejects no-drift"),
    ("model_business_metric", "gauge", "A business metric the service reports"),
    ("model_business_metric_baseline", "gauge", "The business metric's moving baseline"),
    ("model_business_metric_ratio", "gauge", "The business metric over its baseline"),
    ("slo_burn_rate", "gauge", "Error-budget burn rate over one window"),
    ("slo_burn_alert", "gauge", "1 while a multi-window burn-rate pair exceeds its factor"),
)

#: Finer-grained hardware telemetry: per NVLink link (labels node, gpu, uuid, link), per process on
#: a GPU (node, gpu, uuid, pid; attribution job, pod, container), per InfiniBand port (node,
#: device, port). Kept apart from the per-GPU and per-node sets, whose columns the simulator mirrors.
DETAIL_METRICS = _specs(
    ("gpu_process_memory_used_bytes", "gauge", "GPU memory used by one process"),
    ("gpu_nvlink_link_up", "gauge", "1 while this NVLink link is active"),
    ("gpu_nvlink_link_tx_bytes_per_second", "gauge", "NVLink transmit throughput of this link"),
    ("gpu_nvlink_link_rx_bytes_per_second", "gauge", "NVLink receive throughput of this link"),
    ("gpu_nvlink_link_crc_errors_total", "counter", "NVLink CRC flit and data errors of this link"),
    ("gpu_nvlink_link_replay_errors_total", "counter", "NVLink replay errors of this link"),
    ("gpu_nvlink_link_recovery_errors_total", "counter", "NVLink recovery errors of this link"),
    ("ib_port_up", "gauge", "1 while the InfiniBand/RoCE port is ACTIVE"),
    ("ib_port_rate_gbps", "gauge", "Link rate of the port in Gb/s"),
    ("ib_port_rx_bytes_per_second", "gauge", "Receive throughput of the port"),
    ("ib_port_tx_bytes_per_second", "gauge", "Transmit throughput of the port"),
    ("ib_port_rx_bytes_total", "counter", "Bytes received by the port (port_rcv_data x 4)"),
    ("ib_port_tx_bytes_total", "counter", "Bytes sent by the port (port_xmit_data x 4)"),
    ("ib_port_symbol_errors_total", "counter", "Symbol errors of the port"),
    ("ib_port_rcv_errors_total", "counter", "Receive errors of the port"),
    ("ib_port_link_downed_total", "counter", "Times the port's link went down"),
    ("ib_port_link_error_recovery_total", "counter", "Link error recoveries of the port"),
    ("ib_port_xmit_discards_total", "counter", "Outbound packets the port discarded"),
    ("ib_port_xmit_wait_total", "counter", "Ticks the port had data to send but no credits"),
    ("ib_port_out_of_sequence_total", "counter", "RDMA packets received out of sequence (hw_counters)"),
    ("ib_port_packet_seq_errors_total", "counter", "RDMA NAK sequence errors received (hw_counters)"),
    ("ib_port_local_ack_timeout_errors_total", "counter", "RDMA ACK timeouts (hw_counters)"),
    (
        "ib_port_rnr_nak_retry_errors_total",
        "counter",
        "RDMA receiver-not-ready retries exceeded (hw_counters)",
    ),
    ("ib_port_out_of_buffer_total", "counter", "Packets dropped for lack of receive WQEs (hw_counters)"),
)

ALL_METRICS: dict[str, MetricSpec] = {
    **GPU_METRICS,
    **NODE_METRICS,
    **SERVICE_METRICS,
    **DETAIL_METRICS,
    **QUALITY_METRICS,
}

#: Metrics that training ranks report per step in TrainingRecord.metrics.
TRAINING_METRICS = {
    "loss": "Training loss of the step",
    "grad_norm": "Global gradient norm of the step (this rank)",
    "step_seconds": "Wall time of the step",
    "data_wait_seconds": "Time the step waited for input data",
    "tokens_per_second": "Tokens processed per second",
    "samples_per_second": "Samples processed per second",
    "learning_rate": "Learning rate in force",
    "collective_arrival_skew_seconds": "How late this rank arrived at the step's collective vs the first",
    "memory_allocated_bytes": "CUDA caching allocator: allocated bytes",
    "memory_reserved_bytes": "CUDA caching allocator: reserved bytes",
    "memory_fragmentation_ratio": "1 - allocated / reserved",
    "alloc_retries_total": "Allocator retries (cudaMalloc failures that forced a cache flush)",
}

#: Event kinds. Labels say where (node, gpu, job, rank, service); data says what.
EVENT_KINDS = {
    "xid": "An Xid error from the driver; data: code, message",
    "ecc_dbe": "An uncorrectable ECC error event from NVML; data: count",
    "gpu_lost": "A GPU fell off the bus or NVML returned GPU_IS_LOST / UNKNOWN",
    "heartbeat": "A training rank's liveness beat (labels job, rank, node, gpu)",
    "job_started": "A job began; data: kind, placement [[rank, node, gpu], ...]",
    "job_ended": "A job finished normally",
    "job_failed": "A job's processes exited abnormally; data: reason, exit_code",
    "checkpoint_started": "A rank began saving a checkpoint; data: step",
    "checkpoint_completed": "A rank finished saving; data: step, bytes, seconds, manifest",
    "checkpoint_failed": "A save failed; data: step, reason",
    "checkpoint_verified": "A checkpoint's manifest was re-checked; data: step, ok",
    "model_version_registered": "A model version was registered; data: model, version, source",
    "model_version_promoted": "A model version started serving; data: model, version, service",
    "agent_started": "An agent (re)started; data: version, collectors",
    "agent_stopping": "An agent stopped cleanly (SIGTERM/SIGINT): its node left on purpose; data: reason",
    "quality_sketch": "A service's prediction/confidence/input sketch for one window (inference SDK)",
    "serving_window": "A service's request and error counts for one window (inference SDK)",
}

#: XID codes that need a reset or a reboot (DESIGN §3), and those caused by the application.
FATAL_XIDS: frozenset[int] = frozenset(
    {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154}
)
APP_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})
