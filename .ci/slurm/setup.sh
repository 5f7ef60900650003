#!/usr/bin/env bash
# Install Debian's SLURM (controller, node daemon, client commands) and munge, if missing.
set -euo pipefail
version() { dpkg-query -W -f '${Version}' slurm-client; }
if command -v slurmctld > /dev/null && command -v slurmd > /dev/null && command -v sbatch > /dev/null \
    && command -v munged > /dev/null; then
    echo "[slurm-ci] SLURM $(version) already installed"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q > /dev/null
# policy-rc.d on CI machines blocks the packages' own service starts; start.sh starts the daemons
apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge > /dev/null
echo "[slurm-ci] installed SLURM $(version)"
