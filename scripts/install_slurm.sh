#!/usr/bin/env bash
# Slurm's programs for a single-node Slurm: Debian's slurm-wlm (slurmctld, slurmd and the client
# commands) and munge. Nothing here configures or starts a service: `marin slurm start` starts a
# private Slurm on this machine (fray.cluster.slurm_local; the tests start theirs the same way) and
# `marin slurm stop` ends it. Installed with apt-get when missing and this user is root; otherwise
# says so and leaves it, and the Slurm tests skip with that reason. Never fails the caller.
set -u
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm: no apt-get here; the Slurm tests will be skipped (install slurm-wlm and munge to run them)"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install_slurm: installing Slurm needs root (and its tests run the daemons as root); the Slurm tests will be skipped"
    exit 0
fi
echo "install_slurm: installing slurm-wlm and munge from Debian (once)"
export DEBIAN_FRONTEND=noninteractive
log=/tmp/marin-install-slurm.log
if ! timeout 900 apt-get install -y --no-install-recommends slurm-wlm munge >"$log" 2>&1; then
    timeout 300 apt-get update >>"$log" 2>&1
    timeout 900 apt-get install -y --no-install-recommends slurm-wlm munge >>"$log" 2>&1 \
        || echo "install_slurm: apt-get failed (see $log); the Slurm tests will be skipped"
fi
if command -v slurmctld >/dev/null 2>&1; then
    echo "install_slurm: installed; \`marin slurm start\` starts a private Slurm on this machine"
fi
exit 0
