"""Rule jomyaeng_downstream_tasks: the downstream (transfer) tasks' sentences and items."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.data import write_records  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.jomyaeng.probing_tasks import DownstreamSpec, downstream_stats, generate_downstream  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
specs = [DownstreamSpec.from_config(name, p) for name, p in sm.params.tasks.items()]
records, table = generate_downstream(specs, sm.params.seed)
with atomic_path(sm.output.sentences) as tmp:
    write_records(records, tmp)
with atomic_path(sm.output.table) as tmp:
    table.to_csv(tmp, sep="\t", index=False)
with atomic_path(sm.output.stats) as tmp:
    downstream_stats(table).to_csv(tmp, sep="\t", index=False, float_format="%.4f")
log.info("%d items over %d tasks, %d distinct sentences", len(table), len(specs), len(records))
write_tables_html(sm)  # the HTML page of each reported TSV
