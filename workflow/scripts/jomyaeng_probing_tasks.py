"""Rule jomyaeng_probing_tasks: SentEval's ten probing tasks from the bundled treebanks."""

from headatlas.core.data import write_records
from headatlas.core.io import atomic_path, write_tsv
from headatlas.core.runner import setup
from headatlas.jomyaeng.probing_tasks import GeneratorConfig, generate, load_sources, task_stats
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
cfg = GeneratorConfig.from_config(sm.params.generator)
sources = load_sources(sm.params.sources["treebanks"], sm.params.sources["trees"])
log.info("%d source sentences", len(sources))
records, table = generate(sources, cfg)
stats = task_stats(table)
with atomic_path(sm.output.sentences) as tmp:
    write_records(records, tmp)
write_tsv(table, sm.output.table, float_format=None)
write_tsv(stats, sm.output.stats, float_format="%.4f")
log.info(
    "%d items over %d tasks, %d distinct sentences, %d words",
    len(table),
    table["task"].nunique(),
    len(records),
    sum(len(r.words) for r in records),
)
write_tables_html(sm)  # the HTML page of each reported TSV
