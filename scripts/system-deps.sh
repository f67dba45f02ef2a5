#!/usr/bin/env bash
# Debian packages the integration tests and benchmarks drive as real components: installed when
# missing and we are root (CI runs as root); otherwise say what is missing and carry on, and the
# tests that need them skip (outside CI) with that reason.
set -euo pipefail
packages=(prometheus prometheus-alertmanager victoria-metrics chromium postgresql zsh systemd slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-deps: not root or no apt-get; missing Debian packages: ${missing[*]}" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# policy-rc.d keeps the packages' own services from starting: tests start their own on loopback.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
