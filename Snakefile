from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# common.smk first (the helpers and the analysis contract, docs/architecture.md); the others in any order
include: "workflow/rules/common.smk"
include: "workflow/rules/corpora.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/clark_surface.smk"
include: "workflow/rules/pande.smk"
include: "workflow/rules/jomyaeng.smk"
include: "workflow/rules/clark_syntax.smk"
include: "workflow/rules/atlas.smk"


rule all:
    default_target: True
    input:
        all_targets(),
