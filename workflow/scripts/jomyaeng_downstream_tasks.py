"""Rule jomyaeng_downstream_tasks: the downstream (transfer) tasks' sentences and items."""

from headatlas.core.data import write_records
from headatlas.core.io import atomic_path, write_tsv
from headatlas.core.runner import setup
from headatlas.jomyaeng.probing_tasks import DownstreamSpec, downstream_stats, generate_downstream
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
specs = [DownstreamSpec.from_config(name, p) for name, p in sm.params.tasks.items()]
records, table = generate_downstream(specs, sm.params.seed)
with atomic_path(sm.output.sentences) as tmp:
    write_records(records, tmp)
write_tsv(table, sm.output.table, float_format=None)
write_tsv(downstream_stats(table), sm.output.stats, float_format="%.4f")
log.info("%d items over %d tasks, %d distinct sentences", len(table), len(specs), len(records))
write_tables_html(sm)  # the HTML page of each reported TSV
