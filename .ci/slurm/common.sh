# Shared by the .ci/slurm scripts (sourced, not run).
# STATE holds the cluster's config, state, logs and the PIDs of the daemons these scripts started.
STATE=${HEADATLAS_SLURM_STATE:-/var/tmp/headatlas-slurm}
# The config must be at SLURM's default path: the executor plugin's job step removes SLURM_*
# variables (SLURM_CONF too) before it calls srun inside a job.
CONF=/etc/slurm/slurm.conf
# beside it, the node's generic resources (one count-only GPU)
GRES_CONF=/etc/slurm/gres.conf
MARK="# headatlas CI cluster"

say() { echo "[slurm-ci $(date +%T)] $*"; }

# pid_alive PIDFILE NAME: the pid in PIDFILE belongs to a live process called NAME
# (/run and /var/tmp survive on a reused machine, so a pid file alone proves nothing).
pid_alive() {
    local pid
    [ -s "$1" ] || return 1
    pid=$(tr -dc 0-9 < "$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]
}
