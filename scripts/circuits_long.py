"""Rule circuits_long: retrieval heads on needle-in-a-haystack inputs, echo and induction heads at long range."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import numpy as np  # noqa: E402

from headatlas.circuits.analysis import CircuitSettings, long_skipped, long_tables, read_table  # noqa: E402
from headatlas.circuits.longrange import (  # noqa: E402
    LongSettings,
    chat_frame,
    long_range_scores,
    needle_inputs,
    retrieval_runs,
)
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.models import ModelSpec, decoder_bos, lm_head_model, load, model_kind, resolve  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
spec = ModelSpec.from_config(sm.params.model)
settings = CircuitSettings.from_config(sm.params.circuits)
long = LongSettings.from_config({**sm.params.long, "seed": settings.seed})
cache = sm.input.model[0] if sm.input.model else None
model, tokenizer, config = load(spec, cache_dir=cache)
kind = model_kind(config, spec)
n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
if kind != "decoder":
    lm_model, reason = None, f"{kind}: not a causal model"
else:
    loc, kwargs = resolve(spec, cache)
    lm_model, reason = lm_head_model(loc, kind, kwargs)
if lm_model is None:
    tables = long_skipped(spec.name, n_layers, n_heads, reason)
else:
    positions = int(getattr(config, "max_position_embeddings", 0) or spec.max_length)
    bos = decoder_bos(tokenizer, config, spec)
    with open(sm.input.haystack, encoding="utf-8") as fh:
        haystack = np.asarray(tokenizer(fh.read(), add_special_tokens=False)["input_ids"])
    chat = chat_frame(tokenizer) if long.chat else None
    items = needle_inputs(tokenizer, haystack, long, bos, positions, chat)
    runs = retrieval_runs(lm_model, tokenizer, items, long, log)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lr = long_range_scores(model, tokenizer, kind, bos, long, pad, spec.name)
    short = None
    if "detectors" in sm.input.keys():
        d = read_table(sm.input.detectors)
        d = d[d["main"].map(lambda v: str(v) == "True") & (d["detector"] == "induction")].sort_values(["layer", "head"])
        short = d["mean"].to_numpy(float)
    tables = long_tables(runs["runs"], runs["scores"], lr, short, spec.name, n_layers, n_heads, settings)
tables["heads"]["circ_note"] = tables["note"]
for key in ("runs", "heads", "bins", "sets"):
    with atomic_path(sm.output[key]) as tmp:
        tables[key].to_csv(tmp, sep="\t", index=False, float_format="%.5g")
log.info("model %s: long inputs\n%s\n%s", spec.name, tables["bins"].to_string(), tables["sets"].to_string())
write_tables_html(sm)
