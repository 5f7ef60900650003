#!/usr/bin/env bash
# Stop the daemons that start.sh started, by the PIDs it recorded; nothing else. Idempotent.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"

# stop_one NAME: TERM the recorded pid if it is still that daemon, KILL it after 15 s
stop_one() {
    local file="$STATE/started/$1.pid" pid
    pid_alive "$file" "$1" || { rm -f "$file"; return 0; }
    pid=$(tr -dc 0-9 < "$file")
    kill -TERM "$pid" 2> /dev/null
    for _ in $(seq 75); do
        pid_alive "$file" "$1" || break
        sleep 0.2
    done
    if pid_alive "$file" "$1"; then
        say "$1 (pid $pid) ignored SIGTERM; killing it"
        kill -KILL "$pid" 2> /dev/null
        sleep 0.5
    fi
    say "$1 (pid $pid) stopped"
    rm -f "$file"
}

# jobs left by an interrupted run: cancel them while the daemons still run (slurmd's job steps
# outlive slurmd itself); this cluster only ever holds the jobs of these scripts
if pid_alive "$STATE/started/slurmctld.pid" slurmctld && pid_alive "$STATE/started/slurmd.pid" slurmd; then
    mapfile -t left < <(squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2> /dev/null)
    if [ "${#left[@]}" -gt 0 ]; then
        say "cancelling jobs ${left[*]}"
        scancel "${left[@]}" 2> /dev/null
        for _ in $(seq 50); do
            [ -z "$(squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2> /dev/null)" ] && break
            sleep 0.2
        done
    fi
fi
# slurmd first (it may still be ending job steps), then the controller, then munge
stop_one slurmd
stop_one slurmctld
stop_one munged
for f in "$CONF" "$GRES_CONF"; do
    if [ -e "$f" ] && head -1 "$f" | grep -qF "$MARK"; then
        rm -f "$f"
    fi
done
exit 0
