# Assay's campaign DAG. Every step is a Hydra-configured `python -m assay.<step>` command that
# writes files under results/<campaign>/; those files make every step resumable.
#
#   snakemake --cores 8 --resources gpu=4                       # the default campaign
#   snakemake --cores 2 --config overrides='[campaign=ci,tasks=ci,evolve=ci]'
#   snakemake --cores 2 --forcerun translate results/default/offline/L1_1_ReLU/profile.json
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: f"{workflow.basedir}/config/workflow.yaml"


validate(config, "workflow/schemas/workflow.schema.yaml")


include: "workflow/rules/common.smk"


rule all:
    default_target: True
    input:
        report=f"{C}/report.html",
        archive=expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        tracked=expand(f"{C}/{{llm}}/tracked.json", llm=LLMS),


include: "workflow/rules/tasks.smk"
include: "workflow/rules/translate.smk"
include: "workflow/rules/evolve.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/archive.smk"
include: "workflow/rules/report.smk"
