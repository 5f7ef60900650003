"""Rule clark_syntax_probe: train the attention-based probing classifiers and score UAS (Clark Table 3)."""

from headatlas.clark.glove import Glove
from headatlas.clark.parsing_probe import ProbeSettings, run_probes
from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import as_dirs as dirs
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
p = sm.params
settings = ProbeSettings.from_config(p.probe)
evals = {split: (dirs(sm.input[f"{split}_maps"]), load_records(sm.input[f"{split}_corpus"])) for split in p.eval_splits}
outputs = run_probes(
    dirs(sm.input.train_maps), load_records(sm.input.train_corpus), evals, Glove.from_package(settings.glove),
    settings=settings, word_mode=p.word_mode, model=sm.wildcards.model,
)  # fmt: skip
for key, frame in outputs.items():
    write_tsv(frame, sm.output[key])
