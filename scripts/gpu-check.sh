#!/usr/bin/env bash
# A check on a machine with NVIDIA GPUs: one agent round on real NVML with every promised field
# checked (or why NVML does not support it), a short CUDA training read by the SDK, a trimmed
# capture to commit as a fixture, and a verdict. Usage: scripts/gpu-check.sh [OUT_DIR]
# Exit status: 0 PASS, 1 FAIL, 2 no NVIDIA GPU here. PYTHON picks the interpreter (default python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-gpu-check-out}
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m gpuscope.gpucheck "$out"
