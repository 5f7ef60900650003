"""Rule jomyaeng_probe: every probe of one model x task (heads, controls, layers, top-n), or of one
model's tasks in turn (analysis.jomyaeng.probe_jobs: model; the same files and numbers)."""

import time

from headatlas.core.io import write_tsv
from headatlas.core.runner import as_dirs, setup
from headatlas.core.store import AttentionStore
from headatlas.jomyaeng.analysis import TopNSettings, probe_task, task_data, task_features
from headatlas.jomyaeng.probes import ProbeConfig
from headatlas.jomyaeng.probing_tasks import read_table

sm = snakemake
log = setup(sm)


def jobs():
    """(task, its spec, shard dirs, task table, output) for every task of this job."""
    if "task" in sm.wildcards.keys():
        yield sm.wildcards.task, sm.params.task, as_dirs(sm.input.shards), sm.input.table, sm.output[0]
        return
    for task, spec in sm.params.tasks.items():
        group = "probing" if spec["kind"] == "probing" else "downstream"
        yield task, spec, as_dirs(sm.input[f"{group}_shards"]), sm.input[f"{group}_table"], sm.output[task]


tables = {}
for task, spec, shards, table_path, output in jobs():
    t0 = time.time()
    if table_path not in tables:
        tables[table_path] = read_table(table_path)
    table = tables[table_path]
    items = table[table["task"] == task]
    if items.empty:
        raise ValueError(f"{table_path}: no item of task {task!r}")
    with AttentionStore(shards) as store:
        kind = "classification" if spec["kind"] == "probing" else spec["kind"]
        data = task_data(items, list(store.record_id), kind, tuple(spec.get("score_range", (1, 5))))
        heads, layers = task_features(store, data)
    log.info(
        "task %s: %d items (%d dropped: records not in the store), features %s, read in %.1f s",
        task,
        len(data.split),
        data.dropped,
        heads.shape,
        time.time() - t0,
    )
    result = probe_task(
        heads, layers, data, ProbeConfig.from_config(sm.params.probe),
        TopNSettings.from_config(sm.params.top), model=sm.wildcards.model, task=task,
    )  # fmt: skip
    write_tsv(result, output)
    log.info("task %s: %d probes written in %.1f s", task, len(result), time.time() - t0)
