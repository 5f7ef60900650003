# Helpers of workflow/rules/clark_syntax.smk (Clark et al. 2019, Tables 1-3 and Fig. 5).
from headatlas.clark.coref import CorefSettings
from headatlas.clark.parsing_probe import ProbeSettings
from headatlas.clark.syntax import HeadSettings
from headatlas.core.settings import settings_params

CLARK_SYNTAX = analysis_section("clark_syntax", "../schemas/clark_syntax.schema.yaml")


def _check_clark():
    named = {
        "syntax_corpus": [CLARK_SYNTAX["syntax_corpus"]],
        "probe_train": [CLARK_SYNTAX["probe_train"]],
    }
    named["coref_corpora"] = list(CLARK_SYNTAX["coref_corpora"].values())
    named["probe_eval"] = list(CLARK_SYNTAX["probe_eval"].values())
    for key, corpora in named.items():
        for c in corpora:
            if c not in CORPORA:
                raise ValueError(
                    f"config key analysis.clark_syntax.{key}: unknown corpus {c!r}; known: {sorted(CORPORA)}"
                )
    # Fig. 5 draws its examples from the stored maps (of a maps: sample corpus, its sample)
    examples = {
        "syntax_corpus": CLARK_SYNTAX["syntax_corpus"],
        "coref_corpora": next(iter(CLARK_SYNTAX["coref_corpora"].values())),
    }
    for key, c in examples.items():
        if CORPORA[c].get("maps", "full") in (False, "none"):
            raise ValueError(
                f"config key corpora.{c}.maps: none, but analysis.clark_syntax draws the Fig. 5 examples from "
                f"the maps of {c} ({key}); set maps: sample (or full)"
            )
    for base, rnd in CLARK_SYNTAX["random_baseline"].items():
        if base in MODELS and rnd not in MODELS:
            raise ValueError(
                f"config key analysis.clark_syntax.random_baseline.{base}: {rnd!r} is not a model of this config"
            )


def clark_random_model(model):
    """The random-init baseline of a model, or None (entries for absent models are ignored)."""
    return CLARK_SYNTAX["random_baseline"].get(model)


if analysis_active("clark_syntax"):
    _check_clark()
    # the random-init baselines are helper models: their fused extractions run the syntax reducers too
    FUSED_HELPERS["clark_syntax"] = lambda: [
        m for m in CLARK_SYNTAX["random_baseline"].values() if m in MODELS
    ]
CLARK_SYNTAX_MODELS = analysis_models("clark_syntax")


def clark_split_inputs(splits):
    def inputs(wildcards):
        out = {}
        for split, corpus in splits.items():
            out[f"{split}_corpus"] = f"results/corpora/{corpus}.jsonl.gz"
            out[f"{split}_maps"] = shard_dirs(wildcards.model, corpus)
        return out

    return inputs


def clark_table3_inputs(wildcards):
    out = {"uas": f"results/clark/{wildcards.model}/probes/uas.tsv"}
    rnd = clark_random_model(wildcards.model)
    if rnd:
        out["random"] = f"results/clark/{rnd}/probes/uas.tsv"
    return out


def clark_targets():
    files = [
        "syntax/heads.tsv",
        "syntax/baselines.tsv",
        "syntax/table1.tsv",
        "syntax/table1.png",
        "syntax/heads.png",
        "coref/heads.tsv",
        "coref/table2.tsv",
        "coref/table2.png",
        "coref/heads.png",
        "probes/attn_weights.tsv",
        "probes/table3.tsv",
        "probes/table3.png",
        "examples/fig5.png",
    ]
    out = expand("results/clark/{model}/{f}", model=CLARK_SYNTAX_MODELS, f=files)
    return out + ["results/clark/relation_map.tsv"]
