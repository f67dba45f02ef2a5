#!/usr/bin/env bash
# Regenerates src/gpuscope/kube/podresources_pb2.py{,i} from the kubelet's pod-resources proto.
# Usage: scripts/gen-podresources.sh PATH/TO/kubernetes/kubelet  (a checkout; the commit is recorded)
# Needs grpcio-tools (pip install grpcio-tools==1.85.1) in the python on PATH.
set -euo pipefail
repo=$1
out=$(cd "$(dirname "$0")/.." && pwd)/src/gpuscope/kube
commit=$(git -C "$repo" rev-parse HEAD)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$repo/pkg/apis/podresources/v1/api.proto" "$work/api.proto"
(cd "$work" && python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. api.proto)
tools=$(python -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')
{
  printf '# Generated from kubernetes/kubelet pkg/apis/podresources/v1/api.proto at\n# %s by grpcio-tools %s:\n' "$commit" "$tools"
  printf '#   python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. api.proto\n# (scripts/gen-podresources.sh). Do not edit.\n'
  cat "$work/api_pb2.py"
} >"$out/podresources_pb2.py"
{ printf '# Generated with podresources_pb2.py (see there). Do not edit.\n'; cat "$work/api_pb2.pyi"; } >"$out/podresources_pb2.pyi"
