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

#: Per-GPU telemetry that only some sources give (dcgm-exporter's profiling and clock-event
#: fields); same entity labels as GPU_METRICS. Kept apart because the simulator mirrors GPU_METRICS.
GPU_EXTRA_METRICS = _specs(
    (
        "gpu_gr_engine_active_ratio",
        "gauge",
        "Fraction of time the graphics engine was active (DCGM; on MIG too)",
    ),
    ("gpu_encoder_utilization_percent", "gauge", "Percent of time the video encoder was busy"),
    ("gpu_decoder_utilization_percent", "gauge", "Percent of time the video decoder was busy"),
    ("gpu_nvlink_data_bytes_total", "counter", "NVLink data sent and received, all links"),
    (
        "gpu_violation_hw_thermal_seconds_total",
        "counter",
        "Time clocks were cut by the hardware thermal slowdown",
    ),
    (
        "gpu_violation_hw_power_brake_seconds_total",
        "counter",
        "Time clocks were cut by the external power brake",
    ),
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

#: Per-service telemetry some engines give beyond the simulated set; same labels as SERVICE_METRICS.
SERVICE_EXTRA_METRICS = _specs(
    ("inference_queue_time_p50_seconds", "gauge", "Time requests waited in the queue, median"),
    ("inference_queue_time_p95_seconds", "gauge", "Time requests waited in the queue, 95th percentile"),
    ("inference_queue_time_p99_seconds", "gauge", "Time requests waited in the queue, 99th percentile"),
    ("inference_latency_mean_seconds", "gauge", "End-to-end latency, mean since the last scrape"),
    ("inference_queue_time_mean_seconds", "gauge", "Queue time, mean since the last scrape"),
    ("inference_prompt_tokens_total", "counter", "Prompt (prefill) tokens processed"),
    ("inference_generation_tokens_total", "counter", "Tokens generated"),
    ("inference_prompt_tokens_per_second", "gauge", "Prompt tokens processed per second"),
    ("inference_generation_tokens_per_second", "gauge", "Tokens generated per second"),
    ("inference_rejections_total", "counter", "Requests refused at admission (queue full, overloaded)"),
    ("inference_rejections_per_second", "gauge", "Requests refused at admission per second"),
    ("inference_http_5xx_total", "counter", "HTTP responses with a 5xx status"),
    ("inference_http_5xx_per_second", "gauge", "HTTP 5xx responses per second"),
)

#: The scheduler's view (collect/slurm.py). Per partition (labels partition, cluster): demand and
#: capacity; per job (partition, job_id; pending rows add reason); per node (node).
SCHEDULER_METRICS = _specs(
    ("slurm_jobs_pending", "gauge", "Jobs waiting in the partition's queue"),
    ("slurm_jobs_running", "gauge", "Jobs running in the partition"),
    ("slurm_gpus_pending", "gauge", "GPUs the pending jobs ask for (demand)"),
    ("slurm_gpus_running", "gauge", "GPUs the running jobs hold"),
    ("slurm_gpus_total", "gauge", "GPUs on the partition's nodes (capacity)"),
    ("slurm_gpus_unavailable", "gauge", "GPUs on down, drained or draining nodes"),
    ("slurm_oldest_pending_seconds", "gauge", "How long the partition's oldest pending job has waited"),
    ("slurm_job_pending_seconds", "gauge", "How long this pending job has waited"),
    ("slurm_job_queue_wait_seconds", "gauge", "How long this running job waited before it started"),
    ("slurm_job_gpus", "gauge", "GPUs this job asks for or holds"),
    ("slurm_node_unavailable", "gauge", "1 while the node is down, drained or draining"),
    ("slurm_node_gpus", "gauge", "GPUs the node has (gres)"),
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
#: device, port), per serving engine of a model (service labels and dp_rank). Kept apart from the
#: per-GPU and per-node sets, whose columns the simulator mirrors.
DETAIL_METRICS = _specs(
    ("gpu_process_memory_used_bytes", "gauge", "GPU memory used by one process"),
    ("gpu_nvlink_link_up", "gauge", "1 while this NVLink link is active"),
    ("gpu_nvlink_link_tx_bytes_per_second", "gauge", "NVLink transmit throughput of this link"),
    ("gpu_nvlink_link_rx_bytes_per_second", "gauge", "NVLink receive throughput of this link"),
    ("gpu_nvlink_link_crc_errors_total", "counter", "NVLink CRC flit and data errors of this link"),
    ("gpu_nvlink_link_replay_errors_total", "counter", "NVLink replay errors of this link"),
    ("gpu_nvlink_link_recovery_errors_total", "counter", "NVLink recovery errors of this link"),
    ("gpu_owner_allocated", "gauge", "1 for each owner (pod or job) a GPU is shared with; label owner"),
    ("gpu_allocatable", "gauge", "1 for each GPU the kubelet can allocate to pods"),
    ("gpu_owner_utilization_percent", "gauge", "GPU utilization of one owner's share (time-sliced GPUs)"),
    ("gpu_owner_memory_used_bytes", "gauge", "Framebuffer memory of one owner's share (time-sliced GPUs)"),
    # one engine of a service's model (labels as SERVICE_METRICS plus dp_rank, pp_rank)
    ("inference_engine_queue_depth", "gauge", "Requests waiting at one engine (data-parallel rank)"),
    ("inference_engine_running_requests", "gauge", "Requests being served by one engine"),
    ("inference_engine_kv_cache_usage_ratio", "gauge", "Fraction of one engine's KV cache in use"),
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
    ("ib_port_rcv_remote_physical_errors_total", "counter", "Packets received with the EBP delimiter"),
    ("ib_port_rcv_switch_relay_errors_total", "counter", "Packets the switch could not relay"),
    (
        "ib_port_local_link_integrity_errors_total",
        "counter",
        "Times the link's local error threshold was hit",
    ),
    ("ib_port_excessive_buffer_overrun_errors_total", "counter", "Consecutive receive buffer overruns"),
    ("ib_port_vl15_dropped_total", "counter", "Subnet-management packets dropped (VL15)"),
    ("ib_port_xmit_constraint_errors_total", "counter", "Packets not sent for partition/constraint"),
    ("ib_port_rcv_constraint_errors_total", "counter", "Packets dropped for partition/constraint"),
    ("ib_port_tx_packets_total", "counter", "Packets sent by the port"),
    ("ib_port_rx_packets_total", "counter", "Packets received by the port"),
    ("ib_port_duplicate_requests_total", "counter", "Duplicate RDMA requests received (hw_counters)"),
    ("ib_port_implied_nak_seq_errors_total", "counter", "Implied NAK sequence errors (hw_counters)"),
    ("ib_port_cnp_sent_total", "counter", "RoCE congestion notifications sent (ECN seen; hw_counters)"),
    ("ib_port_cnp_handled_total", "counter", "RoCE congestion notifications acted on (hw_counters)"),
    ("ib_port_cnp_ignored_total", "counter", "RoCE congestion notifications ignored (hw_counters)"),
    ("ib_port_ecn_marked_packets_total", "counter", "RoCE packets received with ECN marks (hw_counters)"),
    (
        "ib_port_transport_retries_exceeded_total",
        "counter",
        "QPs that ran out of transport retries and went to error (hw_counters)",
    ),
    ("ib_port_rnr_retries_exceeded_total", "counter", "QPs that ran out of RNR retries (hw_counters)"),
    ("ib_port_req_cqe_errors_total", "counter", "Requester completions with an error (hw_counters)"),
    ("ib_port_resp_cqe_errors_total", "counter", "Responder completions with an error (hw_counters)"),
    ("ib_port_req_cqe_flush_errors_total", "counter", "Requester completions flushed (hw_counters)"),
    ("ib_port_resp_cqe_flush_errors_total", "counter", "Responder completions flushed (hw_counters)"),
    ("ib_port_req_remote_invalid_requests_total", "counter", "Remote invalid-request NAKs (hw_counters)"),
    ("ib_port_req_remote_access_errors_total", "counter", "Remote access errors as requester (hw_counters)"),
    ("ib_port_resp_remote_access_errors_total", "counter", "Remote access errors as responder (hw_counters)"),
    ("ib_port_resp_local_length_errors_total", "counter", "Local length errors as responder (hw_counters)"),
    ("ib_port_roce_adaptive_retrans_total", "counter", "RoCE adaptive retransmissions (hw_counters)"),
    ("ib_port_roce_adaptive_retrans_timeouts_total", "counter", "RoCE adaptive retransmission timeouts"),
    ("ib_port_roce_slow_restarts_total", "counter", "RoCE slow restarts (hw_counters)"),
    ("ib_port_roce_slow_restart_cnps_total", "counter", "CNPs sent during RoCE slow restart (hw_counters)"),
    ("ib_port_roce_slow_restart_trans_total", "counter", "RoCE slow-restart state transitions (hw_counters)"),
    ("ib_port_rx_icrc_encapsulated_total", "counter", "RoCE packets with an ICRC error (hw_counters)"),
)

ALL_METRICS: dict[str, MetricSpec] = {
    **GPU_METRICS,
    **GPU_EXTRA_METRICS,
    **NODE_METRICS,
    **SERVICE_METRICS,
    **SERVICE_EXTRA_METRICS,
    **DETAIL_METRICS,
    **QUALITY_METRICS,
    **SCHEDULER_METRICS,
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
    "collective_arrival_gap_seconds": "Previous collective's end to this rank's arrival at the step's first",
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
    "heartbeat_seen": "Stored by a hub whose meta store is PostgreSQL instead of every heartbeat: a rank "
    "began beating, or beat again after a silence (labels and data of that beat)",
    "heartbeat_lost": "Stored by such a hub: a rank silent for 60 s, at the time of its last beat",
    "job_started": "A job began; data: kind, placement [[rank, node, gpu], ...], checkpoint_every "
    "(seconds, optional: the interval the training script saves at)",
    "job_ended": "A job finished normally",
    "job_failed": "A job's processes exited abnormally; data: reason, exit_code (a rank's last words: "
    "labels rank, node, gpu; data: cause, exception, message, signal, step)",
    "process_exited": "A node's agent saw a training rank's process end (labels job, rank, node; data: "
    "pid, exit_code or signal where the kernel's process-event connector told it, reason, source)",
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

#: NVIDIA's XID catalog: "Resolution Bucket (Immediate Action)" per code, from the catalog at
#: docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html in NVIDIA's machine-readable copy,
#: NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv
#: at 6f8b0fcfa8e502bdda78fabf96facef729a9285b (154's action is "follow guidance as it applies to
#: another Xid": its message names the recovery action).
XID_ACTIONS: dict[str, frozenset[int]] = {
    "UNEXPECTED_ERR_REPORT_ISSUE": frozenset(
        {*range(1, 8), 9, 10, 12, *range(15, 25), *range(26, 31), *range(33, 37), 42, 47}
        | {*range(49, 54), *range(55, 60), 61, 65, 73, 81, 87, 90, 91, 108, *range(111, 119)}
        | {*range(122, 126), 138, 142}
    ),
    "RESTART_APP": frozenset(
        {8, 11, 13, 25, 31, 32, *range(39, 42), 60, *range(68, 73), *range(75, 78), 80, *range(82, 87)}
        | {88, 89, 94, *range(96, 106), *range(126, 136), 139}
    ),
    "IGNORE": frozenset(
        {14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 121, 137, 141, 152, 153, 157, 161}
    ),
    "WORKFLOW_XID_45": frozenset({45}),
    "RESET_GPU": frozenset({46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 162}),
    "WORKFLOW_XID_48": frozenset({48}),
    "CHECK_MECHANICALS": frozenset({54}),
    "WORKFLOW_NVLINK_ERR": frozenset({74}),
    "UPDATE_SWFW": frozenset({78}),
    "RESTART_BM": frozenset({79, 160}),
    "WORKFLOW_NVLINK5_ERR": frozenset(range(144, 151)),
    "RESTART_VM": frozenset({151}),
    "FOLLOW_LINKED_XID": frozenset({154}),
    "CHECK_UVM": frozenset({159}),
}
#: The actions NVIDIA's copy marks FATAL (every code with one of them is FATAL there, and no other).
NVIDIA_FATAL_ACTIONS = frozenset(
    {
        "UNEXPECTED_ERR_REPORT_ISSUE",
        "RESET_GPU",
        "WORKFLOW_XID_48",
        "CHECK_MECHANICALS",
        "WORKFLOW_NVLINK_ERR",
        "UPDATE_SWFW",
        "RESTART_BM",
        "WORKFLOW_NVLINK5_ERR",
        "RESTART_VM",
    }
)
XID_ACTION: dict[int, str] = {code: action for action, codes in XID_ACTIONS.items() for code in codes}
#: Codes that page (``gpu_xid_fatal``): NVIDIA's FATAL codes, plus 63, 92, 94 and 154, which DESIGN §3
#: and the scenario scorer's contract list as fatal although NVIDIA's catalog does not (their
#: findings carry NVIDIA's action); and those caused by the application (``gpu_xid_app``).
FATAL_XIDS: frozenset[int] = frozenset(
    {code for code, action in XID_ACTION.items() if action in NVIDIA_FATAL_ACTIONS} | {63, 92, 94, 154}
)
APP_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})
