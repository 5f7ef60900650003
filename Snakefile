import sys
from pathlib import Path

from snakemake.utils import min_version

# The one route to the headatlas library (docs/architecture.md): scripts/ on sys.path for this parse,
# and on PYTHONPATH for every job, which inherits it (local runs, SLURM, conda envs without the package).
_scripts = str(Path(workflow.basedir) / "scripts")
sys.path.insert(0, _scripts)
from headatlas.core.inputs import check_yaml
from headatlas.core.runner import export_library_path
from headatlas.core.terminal import one_line_jobs

export_library_path(_scripts)
one_line_jobs()  # the terminal: one line per started job; the run's log file keeps the details

min_version("9.0")


# The default config only when no --configfile is given: a config given on the command line
# means exactly that config (its `extends:` key names configs to merge under it, common.smk).
# Snakemake's message for a YAML error names no line: check the default config first.
if not workflow.overwrite_configfiles:
    if Path("config/config.yaml").exists():
        check_yaml("config/config.yaml")

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
include: "workflow/rules/detectors.smk"
include: "workflow/rules/atlas.smk"
include: "workflow/rules/ablation.smk"
include: "workflow/rules/position.smk"
include: "workflow/rules/circuits.smk"
include: "workflow/rules/icl.smk"
include: "workflow/rules/quiet.smk"


warn_predicted_memory()  # against this machine's memory or --resources mem_mb, before any job starts


rule all:
    default_target: True
    input:
        all_targets(),
