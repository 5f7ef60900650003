"""Rule atlas_page: the interactive atlas page of every model (results/atlas/index.html)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.atlas import page as pg  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
settings = pg.PageSettings.from_config(sm.params.page)
corpus_path = f"results/corpora/{settings.corpus}.jsonl.gz"
html, sizes = pg.build_page(sm.params.sources, corpus_path, settings, sm.output[0])
log.info("atlas page %s: %d bytes; per model: %s", sm.output[0], len(html.encode("utf-8")), sizes)
