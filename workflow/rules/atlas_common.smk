from headatlas.atlas.analysis import ATLAS_SOURCES, AtlasSettings, source_inputs
from headatlas.atlas.page import PageSettings
from headatlas.core.settings import settings_params

ATLAS = analysis_section("atlas", "../schemas/atlas.schema.yaml")
ATLAS_MODELS = analysis_models("atlas")


def atlas_inputs(wildcards):
    """The per-head tables of every analysis covering this model (the registry
    headatlas.atlas.analysis.ATLAS_SOURCES says which), and one store for the grid size.
    """
    m = wildcards.model
    out = {}
    for source in ATLAS_SOURCES:
        covered = m in analysis_models(source.analysis)
        corpora = analysis_corpora(source.analysis, m)
        out.update(source_inputs(source, m, covered, corpora, ATLAS))
    out["tokens"] = f"{shard_dirs(m, model_corpora(m)[0])[0]}"
    return out


def atlas_targets():
    files = [
        "atlas.tsv",
        "atlas.png",
        "agreement.tsv",
        "relation_heads.tsv",
        "agreement.png",
        "profile.tsv",
    ]
    out = expand("results/atlas/{model}/{f}", model=ATLAS_MODELS, f=files)
    return (
        out
        + expand(
            "results/atlas/cross_model_{family}.png",
            family=["pande", "clark", "probing"],
        )
        + ["results/atlas/cross_model.tsv", "results/atlas/index.html"]
    )


register_targets("atlas", atlas_targets)


def atlas_page_sources():
    """Per atlas model, what the atlas page reads: its atlas and agreement tables, the stores
    of the page corpus (none when that corpus is not extracted for the model) and Pande's
    sentence scores on it (None when Pande does not cover the model on that corpus)."""
    corpus = ATLAS["page"]["corpus"]
    out = {}
    for m in ATLAS_MODELS:
        pande = m in analysis_models("pande") and corpus in (
            analysis_corpora("pande", m) or []
        )
        out[m] = {
            "atlas": f"results/atlas/{m}/atlas.tsv",
            "agreement": f"results/atlas/{m}/agreement.tsv",
            "stores": shard_dirs(m, corpus) if corpus in model_corpora(m) else [],
            "scores": f"results/pande/{m}/scores/{corpus}.h5" if pande else None,
        }
    return out


def atlas_page_inputs(wildcards):
    sources = atlas_page_sources()
    files = [
        f
        for s in sources.values()
        for f in [s["atlas"], s["agreement"], *s["stores"], s["scores"]]
        if f
    ]
    if any(s["stores"] for s in sources.values()):
        files.append(f"results/corpora/{ATLAS['page']['corpus']}.jsonl.gz")
    return files
