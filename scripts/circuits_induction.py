"""Rule circuits_induction: mean-ablate the top previous-token heads and measure the induction heads again."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from headatlas.circuits.analysis import composition_from_pairs, read_table  # noqa: E402
from headatlas.circuits.induction import InductionSettings, ablation_check, ablation_tables  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.detectors.inputs import DetectorSettings, random_inputs  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
spec = ModelSpec.from_config(sm.params.model)
settings = InductionSettings.from_config(
    {**sm.params.induction, **{k: sm.params.circuits[k] for k in ("bootstrap", "ci", "seed")}}
)
model, tokenizer, config = load(spec, cache_dir=sm.input.model[0] if sm.input.model else None)
kind = model_kind(config, spec)
detectors = pd.read_csv(sm.input.detectors, sep="\t")
if kind != "decoder":
    summary = pd.DataFrame([{"model": spec.name, "status": "skipped", "reason": f"{kind}: not a causal model"}])
    per_head = pd.DataFrame()
else:
    det = DetectorSettings.from_config(sm.params.detectors)
    bos = decoder_bos(tokenizer, config, spec)
    seqs, kinds = random_inputs(tokenizer, kind, bos, det, spec.max_length, 0, spec.name)
    repeated = [t for t, k in zip(seqs, kinds) if k == "repeated"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    result = ablation_check(model, repeated, kind, pad, spec.name, detectors, settings, det.batch_size)
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    comp = composition_from_pairs(read_table(sm.input.pairs), n_layers, n_heads)
    main = detectors[detectors["main"].map(lambda v: str(v) == "True") & (detectors["detector"] == "prev")]
    prev = np.full((n_layers, n_heads), np.nan)
    prev[main["layer"], main["head"]] = main["mean"]
    summary, per_head = ablation_tables(result, spec.name, settings, comp, prev, n_heads)
for key, df in (("summary", summary), ("heads", per_head)):
    with atomic_path(sm.output[key]) as tmp:
        df.to_csv(tmp, sep="\t", index=False, float_format="%.5g")
log.info("model %s: induction check\n%s\n%s", spec.name, summary.T.to_string(), per_head.to_string())
write_tables_html(sm)
