"""Rule atlas_page: the interactive atlas page of every model (results/atlas/index.html)."""

from headatlas.atlas import page as pg
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
settings = pg.PageSettings.from_config(sm.params.page)
corpus_path = f"results/corpora/{settings.corpus}.jsonl.gz"
html, sizes = pg.build_page(sm.params.sources, corpus_path, settings, sm.output[0])
log.info("atlas page %s: %d bytes; per model: %s", sm.output[0], len(html.encode("utf-8")), sizes)
