#!/usr/bin/env bash
# CI's cluster check: run the tiny config on a real single-node SLURM cluster (slurmctld + slurmd
# + munge on localhost) with --profile profiles/slurm, and check that
#   1. every job of the run was a SLURM job (its SLURM job id in snakemake's log, a SLURM log
#      file per job id, and SLURM's own record of the job as COMPLETED);
#   2. the results equal those of a local run (--profile profiles/default) of the same config;
#   3. a failing job (a malformed corpus file) is reported as failed (SLURM state FAILED,
#      snakemake exits non-zero), not hung;
#   4. with --profile profiles/slurm-gpu the model-running jobs asked for and were granted the
#      node's one (count-only) GPU in partition gpu while the others were not, and, finding no
#      CUDA, ran on the CPU and said so in their logs.
# Prints the wall time of both runs. Stops the daemons it started (by PID) on any exit.
# Bound it from outside with SIGINT, which makes snakemake cancel its SLURM jobs:
#   timeout -s INT -k 30 1500 bash .ci/slurm/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/.ci/slurm"
. "$HERE/common.sh"
cd "$ROOT"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
WORK=${HEADATLAS_SLURM_WORK:-$(mktemp -d /tmp/headatlas-slurm-ci.XXXXXX)}
SHARDS=${HEADATLAS_SLURM_SHARDS:-2}
# what the tiny config keeps of the default config: the Clark surface and Pande analyses (with the
# atlas that joins them) on the WikiText segments, with the tiny BERT (the other analyses and
# models would only add minutes of the same kind of jobs)
ANALYSES=${HEADATLAS_SLURM_ANALYSES:-clark_surface,pande}
CORPORA=${HEADATLAS_SLURM_CORPORA:-wiki}
MODELS=${HEADATLAS_SLURM_MODELS:-tinybert}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

# bounded LIMIT CMD...: CMD under its own time limit. Snakemake must get exactly one SIGINT
# (a second one interrupts its scancel of the SLURM jobs): CMD runs in a session of its own
# (setsid), so neither the signal that .ci/run's `timeout -s INT` sends to its process group nor
# the group-wide copy of the nested timeout reaches it; the nested timeout sends it one SIGINT
# when LIMIT is up, and the trap below has it send one when this script is interrupted.
CHILD=
bounded() {
    local limit=$1 rc=0
    shift
    timeout -s INT -k 30 "$limit" setsid "$@" &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=
    return "$rc"
}
on_signal() {
    trap '' INT TERM # once: timeout sends its signal to this script and to its process group
    say "interrupted; stopping the running command" >&3
    if [ -n "$CHILD" ]; then
        kill -INT "$CHILD" 2> /dev/null || true
        wait "$CHILD" 2> /dev/null || true
    fi
    exit 130
}
# the traps write to the script's own output, not to the log of the command they interrupt
exec 3>&1 4>&2
trap 'bash "$HERE/stop.sh" >&3 2>&4' EXIT
trap on_signal INT TERM

fail() {
    echo "SLURM CHECK FAILED: $*" >&2
    exit 1
}
# show_log FILE: the end of a run's log, for a failure message
show_log() { tail -40 "$1" >&2; }
now() { date +%s.%N; }
secs() { python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$1" "$2"; }

bash "$HERE/setup.sh"
bash "$HERE/start.sh"

say "building the tiny config in $WORK/tiny (models $MODELS, analyses $ANALYSES on $CORPORA, $SHARDS shards)"
python tests/tiny_workflow.py build "$WORK/tiny" --shards "$SHARDS" --analyses "$ANALYSES" --corpora "$CORPORA" \
    --models "$MODELS" > /dev/null 2> "$WORK/build.log" || {
    show_log "$WORK/build.log"
    fail "could not build the tiny config"
}
SM=(snakemake -s "$ROOT/Snakefile" --configfile "$WORK/tiny/config.yaml")

say "local run (--profile profiles/default --cores 2)"
t0=$(now)
bounded 480 "${SM[@]}" -d "$WORK/local" --profile profiles/default --cores 2 > "$WORK/local.log" 2>&1 || {
    show_log "$WORK/local.log"
    fail "the local run failed (log $WORK/local.log)"
}
local_s=$(secs "$t0" "$(now)")

say "HTML report of the local run (snakemake --report)"
bounded 300 "${SM[@]}" -d "$WORK/local" --report "$WORK/report.html" > "$WORK/report.log" 2>&1 || {
    show_log "$WORK/report.log"
    fail "snakemake --report failed (log $WORK/report.log)"
}
[ -s "$WORK/report.html" ] || fail "snakemake --report wrote no report"

say "SLURM run (--profile profiles/slurm)"
t0=$(now)
bounded 600 "${SM[@]}" -d "$WORK/slurm" --profile profiles/slurm \
    --slurm-init-seconds-before-status-checks 8 --slurm-keep-successful-logs > "$WORK/slurm.log" 2>&1 || {
    show_log "$WORK/slurm.log"
    fail "the SLURM run failed or timed out (log $WORK/slurm.log)"
}
slurm_s=$(secs "$t0" "$(now)")

# 1. every finished job but the local target rule was submitted with sbatch
python - "$WORK/slurm.log" "$WORK/slurm/.snakemake/slurm_logs" > "$WORK/slurm_jobs.txt" << 'EOF' || fail "$(cat "$WORK/slurm_jobs.txt")"
import re, sys
from pathlib import Path

log = Path(sys.argv[1]).read_text()
finished = dict(re.findall(r"Finished jobid: (\d+) \(Rule: (\w+)\)", log))
submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log))
local = set(re.findall(r"^(?:\[[\d:]+\] )?localrule (\w+)\b", log, re.M))  # a job block or the one-line form
remote = {j: r for j, r in finished.items() if r not in local}
missing = sorted(f"{j} ({r})" for j, r in remote.items() if j not in submitted)
if not remote or missing:
    print(f"jobs that did not run as SLURM jobs: {missing or 'none ran at all'}")
    sys.exit(1)
no_log = sorted(submitted[j] for j in remote if not list(Path(sys.argv[2]).rglob(f"{submitted[j]}.log")))
if no_log:
    print(f"SLURM jobs without a SLURM log file: {no_log}")
    sys.exit(1)
for j, r in sorted(remote.items(), key=lambda x: int(submitted[x[0]])):
    print(submitted[j], r)
EOF
ids=$(cut -d' ' -f1 "$WORK/slurm_jobs.txt" | paste -sd,)
squeue -h -t all -j "$ids" -o "%i %T" > "$WORK/slurm_states.txt"
n_jobs=$(wc -l < "$WORK/slurm_jobs.txt")
n_done=$(grep -c " COMPLETED$" "$WORK/slurm_states.txt" || true)
[ "$n_done" -eq "$n_jobs" ] || fail "SLURM does not report all $n_jobs jobs COMPLETED: $(tr '\n' ' ' < "$WORK/slurm_states.txt")"
say "all $n_jobs jobs ran as SLURM jobs (ids $ids), all COMPLETED:"
sed 's/^/    SLURM job /' "$WORK/slurm_jobs.txt"

# 2. the same results as the local run
python tests/tiny_workflow.py compare "$WORK/local/results" "$WORK/slurm/results" > "$WORK/compare.txt" \
    || fail "SLURM and local results differ: $(cat "$WORK/compare.txt")"
say "$(tail -1 "$WORK/compare.txt")"

# 3. a failing job: a corpus file with a malformed CoNLL-U line; its prepare_corpus job must end
#    as FAILED and snakemake must exit non-zero well before the time limit
mkdir -p "$WORK/broken"
printf '# sent_id = broken-1\n1\tThis\tthis\n\n' > "$WORK/broken/broken.conllu"
python - "$WORK/tiny/config.yaml" "$WORK/broken" << 'EOF'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
cfg["corpora"]["broken"] = {"kind": "conllu", "path": sys.argv[2] + "/broken.conllu"}
yaml.safe_dump(cfg, open(sys.argv[2] + "/config.yaml", "w"), sort_keys=False)
EOF
target="results/corpora/broken.jsonl.gz"
say "failing job: $target"
t0=$(now)
rc=0
bounded 150 snakemake -s "$ROOT/Snakefile" --configfile "$WORK/broken/config.yaml" -d "$WORK/slurm" \
    --profile profiles/slurm --slurm-init-seconds-before-status-checks 8 "$target" > "$WORK/failing.log" 2>&1 || rc=$?
fail_s=$(secs "$t0" "$(now)")
[ "$rc" -ne 0 ] || fail "a malformed corpus was reported as prepared"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the failing job was not reported within 150 s (hung)"
grep -q "SLURM status is: 'FAILED'" "$WORK/failing.log" || {
    show_log "$WORK/failing.log"
    fail "snakemake did not report the SLURM job as FAILED"
}
[ ! -e "$WORK/slurm/$target" ] || fail "the failed job left its output $target"
grep -rqF "broken.conllu:2: expected 10 tab-separated columns" "$WORK/slurm/.snakemake/slurm_logs/rule_prepare_corpus" \
    || fail "the failed job's SLURM log does not hold its error"
say "the failing job was reported as FAILED (snakemake exit code $rc after $fail_s s)"

# 4. GPUs: the node has one count-only GPU (gres.conf). With --profile profiles/slurm-gpu the
#    model-running jobs of a device-auto model ask for it and go to partition gpu, the rest to cpu:
#    here an extraction shard and the Clark gradients (GPU jobs), their corpus and the gradient
#    figure (CPU jobs). SLURM's record of each job (scontrol show job -d: TresPerJob = what it asked
#    for, JOB_GRES = what it was granted; sacct --completion: partition and state, read from the
#    job-completion file, as there is no slurmdbd) must show that the GPU jobs asked for and were
#    granted gpu:1 in partition gpu and the others neither; and the GPU jobs, finding no CUDA, ran
#    on the CPU and said so in their logs.
mkdir -p "$WORK/gpu"
python - "$WORK/tiny/config.yaml" "$WORK/gpu/config.yaml" << 'EOF'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
for m in cfg["models"]:
    m["device"] = "auto"
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
EOF
model=${MODELS%%,*}
corpus=${CORPORA%%,*}
gpu_targets=("results/attention/$model/$corpus/shard0of$SHARDS" "results/clark/$model/$corpus/fig3_gradients.png")
say "GPU run (--profile profiles/slurm-gpu): ${gpu_targets[*]}"
t0=$(now)
bounded 400 snakemake -s "$ROOT/Snakefile" --configfile "$WORK/gpu/config.yaml" -d "$WORK/gpu" --profile "$ROOT/profiles/slurm-gpu" \
    --slurm-init-seconds-before-status-checks 8 --slurm-keep-successful-logs "${gpu_targets[@]}" > "$WORK/gpu.log" 2>&1 || {
    show_log "$WORK/gpu.log"
    fail "the GPU run failed or timed out (log $WORK/gpu.log)"
}
gpu_s=$(secs "$t0" "$(now)")
python - "$WORK/gpu.log" > "$WORK/gpu_jobs.txt" << 'EOF'
import re, sys
log = open(sys.argv[1]).read()
rules = dict(re.findall(r"Finished jobid: (\d+) \(Rule: (\w+)\)", log))
for job, slurm in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log):
    print(slurm, rules.get(job, "unfinished"))
EOF
: > "$WORK/gpu_record.txt"
while read -r id rule; do
    rec=$(scontrol show job -d "$id") || fail "SLURM has no record of job $id ($rule)"
    part=$(grep -o "Partition=[^ ]*" <<< "$rec" | cut -d= -f2 || true)
    asked=$(grep -o "TresPerJob=[^ ]*" <<< "$rec" | cut -d= -f2- || true)
    granted=$(grep -o "JOB_GRES=[^ ]*" <<< "$rec" | cut -d= -f2- || true)
    echo "$id $rule partition=$part asked=${asked:-none} granted=${granted:-none}" >> "$WORK/gpu_record.txt"
done < "$WORK/gpu_jobs.txt"
ids=$(cut -d' ' -f1 "$WORK/gpu_jobs.txt" | paste -sd,)
sacct --completion -j "$ids" -o JobID,JobName%36,Partition,State > "$WORK/gpu_sacct.txt" 2>&1 || true
say "SLURM's record of the GPU run's jobs (scontrol show job -d: asked = TresPerJob, granted = JOB_GRES):"
sed 's/^/    /' "$WORK/gpu_record.txt"
say "sacct --completion -j $ids (the job-completion file):"
sed 's/^/    /' "$WORK/gpu_sacct.txt"
python - "$WORK/gpu_record.txt" "$WORK/gpu_sacct.txt" > "$WORK/gpu_check.txt" << 'EOF' || fail "GPU requests: $(cat "$WORK/gpu_check.txt")"
import sys

gpu_rules = {"extract_attention", "clark_gradients"}
cpu_rules = {"prepare_corpus", "clark_gradient_figure"}
jobs = {}
for line in open(sys.argv[1]):
    id_, rule, *kv = line.split()
    jobs[rule] = dict(k.split("=", 1) for k in kv) | {"id": id_}
bad = [f"{r}: no SLURM job" for r in sorted(gpu_rules | cpu_rules) if r not in jobs]
for r, j in sorted(jobs.items()):
    want = ("gpu", "gres:gpu:1", "gpu:1") if r in gpu_rules else ("cpu", "none", "(null)")
    if (j["partition"], j["asked"], j["granted"]) != want:
        bad.append(f"{r}: partition, asked, granted = {j['partition']}, {j['asked']}, {j['granted']}; expected {want}")
    row = next((ln.split() for ln in open(sys.argv[2]) if ln.split()[:1] == [j["id"]]), None)
    if not row or row[-2:] != [want[0], "COMPLETED"]:
        bad.append(f"{r}: sacct --completion says {row}; expected partition {want[0]}, COMPLETED")
print("; ".join(bad))
sys.exit(1 if bad else 0)
EOF
for rule_log in "logs/extract_attention/$model/$corpus/shard0of$SHARDS.log" "logs/clark_gradients/$model/$corpus.log"; do
    grep -q "was granted, but CUDA is not available.*running on the CPU" "$WORK/gpu/$rule_log" \
        || fail "the GPU job's log $rule_log does not say it ran on the CPU: $(grep device "$WORK/gpu/$rule_log")"
done
say "the GPU jobs asked for and were granted gpu:1 in partition gpu, the others neither; the extraction job's log says:"
grep -h "device cpu" "$WORK/gpu/logs/extract_attention/$model/$corpus/shard0of$SHARDS.log" | sed 's/^/    /'

cat > "$WORK/times.txt" << EOF
jobs: $n_jobs (shards per corpus: $SHARDS), node CPUs: $(getconf _NPROCESSORS_ONLN)
local run (--profile profiles/default --cores 2): $local_s s
SLURM run (--profile profiles/slurm): $slurm_s s
GPU run (--profile profiles/slurm-gpu, $(wc -l < "$WORK/gpu_jobs.txt") jobs): $gpu_s s
EOF
say "wall times:"
sed 's/^/    /' "$WORK/times.txt"
say "SLURM check passed (work directory $WORK)"
