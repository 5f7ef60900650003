#!/usr/bin/env bash
# Start a single-node SLURM cluster on localhost: munged, slurmctld, slurmd (no systemd needed).
# The daemons fork into the background; stop.sh stops exactly the ones started here, by PID.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"

# leftovers of an earlier, interrupted run of these scripts
bash "$HERE/stop.sh"
rm -rf "$STATE"
mkdir -p "$STATE/ctld" "$STATE/spool" "$STATE/started"

# munge: the key comes with the package; make one if it is missing
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 755 /run/munge
if pid_alive /run/munge/munged.pid munged; then
    say "munged already running (pid $(cat /run/munge/munged.pid)); using it"
else
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged
    cp /run/munge/munged.pid "$STATE/started/munged.pid"
    say "munged started (pid $(cat "$STATE/started/munged.pid"))"
fi
munge -n | unmunge > /dev/null

# slurm.conf: all CPUs slurmd detects, 80% of its memory
detected=$(slurmd -C | head -1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$detected")
mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$detected")
mem=$((mem * 8 / 10))
for f in "$CONF" "$GRES_CONF"; do
    if [ -e "$f" ] && ! head -1 "$f" | grep -qF "$MARK"; then
        echo "$f exists and was not written by these scripts; not touching a real cluster's config" >&2
        exit 1
    fi
done
mkdir -p "$(dirname "$CONF")"
{
    echo "$MARK (written by .ci/slurm/start.sh, removed by stop.sh)"
    sed -e "s|@STATE@|$STATE|g" -e "s|@CPUS@|$cpus|g" -e "s|@MEM_MB@|$mem|g" \
        -e "s|@CTLD_PORT@|${HEADATLAS_SLURMCTLD_PORT:-6817}|g" -e "s|@SLURMD_PORT@|${HEADATLAS_SLURMD_PORT:-6818}|g" \
        "$HERE/slurm.conf.in"
} > "$CONF"
# one GPU that SLURM counts and grants but loads no GPU plugin for (CountOnly: no CUDA_VISIBLE_DEVICES,
# nothing constrained); SLURM 22.05 drops a GPU without File=, so it names /dev/null
printf '%s\nNodeName=localhost Name=gpu File=/dev/null Flags=CountOnly\n' "$MARK (written by .ci/slurm/start.sh, removed by stop.sh)" > "$GRES_CONF"
say "slurm.conf: node localhost, $cpus CPUs, RealMemory $mem MB, one count-only GPU (gres.conf), state in $STATE"

# -c: start from an empty state (no jobs or node states of an earlier run)
slurmctld -c
for _ in $(seq 50); do pid_alive "$STATE/slurmctld.pid" slurmctld && break; sleep 0.2; done
pid_alive "$STATE/slurmctld.pid" slurmctld || { cat "$STATE/slurmctld.log" >&2; echo "slurmctld did not start" >&2; exit 1; }
cp "$STATE/slurmctld.pid" "$STATE/started/slurmctld.pid"
slurmd -N localhost
for _ in $(seq 50); do pid_alive "$STATE/slurmd.pid" slurmd && break; sleep 0.2; done
pid_alive "$STATE/slurmd.pid" slurmd || { cat "$STATE/slurmd.log" >&2; echo "slurmd did not start" >&2; exit 1; }
cp "$STATE/slurmd.pid" "$STATE/started/slurmd.pid"
say "slurmctld (pid $(cat "$STATE/slurmctld.pid")) and slurmd (pid $(cat "$STATE/slurmd.pid")) started"

# wait (at most 60 s) until the node takes jobs; stop at once if a daemon died (a config it rejects)
state=unknown
end=$((SECONDS + 60))
while [ "$SECONDS" -lt "$end" ]; do
    pid_alive "$STATE/slurmctld.pid" slurmctld && pid_alive "$STATE/slurmd.pid" slurmd || { state=dead; break; }
    state=$(timeout 5 sinfo -h -n localhost -o %T 2>/dev/null | head -1 || true)
    case "$state" in
        idle | mixed | allocated) break ;;
        down* | drain*) scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle | mixed | allocated) say "node localhost is $state" ;;
    *)
        tail -n 20 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2
        echo "node localhost did not become idle (state '$state')" >&2
        exit 1
        ;;
esac
