"""Rule clark_mds: MDS of the head distances, within- vs between-layer distance, Fig. 6."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.clark.clustering import distance_square, head_index, layer_clustering, mds_embedding  # noqa: E402
from headatlas.clark.figures import fig6_mds  # noqa: E402
from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params
long = pd.read_csv(sm.input.distances, sep="\t")
d, n_layers, n_heads = distance_square(long)
coords, stress = mds_embedding(d, p.seed, p.n_init, p.max_iter, p.eps)
heads = head_index(n_layers, n_heads)
behaviour = pd.read_csv(sm.input.behaviour, sep="\t")
heads = heads.merge(behaviour[["model", "layer", "head", "label"]], on=["layer", "head"], how="left", validate="1:1")
heads = heads[["model", "layer", "head", "label"]].assign(mds_x=coords[:, 0], mds_y=coords[:, 1])
stats = layer_clustering(d, heads["layer"].to_numpy(), p.permutations, p.seed)
layers = pd.DataFrame(
    [dict(model=sm.wildcards.model, **stats, mds_stress=stress, n_sequences=int(long["n_sequences"].iloc[0]), n_tokens=int(long["n_tokens"].iloc[0]))]
)
with atomic_path(sm.output.heads) as tmp:
    heads.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
with atomic_path(sm.output.layers) as tmp:
    layers.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
save_figure(fig6_mds(heads, sm.wildcards.model, sm.wildcards.corpus, stats), sm.output.png, sm.output.svg)
log.info("within %.4f between %.4f p %.3g stress %.3g", stats["within_layer"], stats["between_layer"], stats["p_value"], stress)
