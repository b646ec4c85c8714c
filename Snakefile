# Assay's campaign DAG. Every step is a Hydra-configured `python -m assay.steps.<rule>` command
# that writes files under results/<campaign>/; those files make every step resumable.
# The overrides every step runs with come from config/workflow.yaml unless `--config` gives them;
# `make run`, `assay run` and a bare `snakemake` agree on them (README, "Running campaigns"):
#
#   snakemake --cores 8 --resources gpu=4                       # the default campaign
#   snakemake --cores 2 --config overrides='[campaign=ci,tasks=ci,evolve=ci]'
#   assay run --rerun L1_1_ReLU                                  # every stage of one task again
#   snakemake --cores 2 --forcerun results/default/offline/L1_1_ReLU/gen_0/proposals.json
#
# Targets go before `--config` and `--forcerun` (both take every word after them).
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: f"{workflow.basedir}/config/workflow.yaml"


# `--config overrides='[a=1,llms=[x,y]]'`: Snakemake cannot parse a list inside the list and
# passes the text on; split it here, at the top level only.
if isinstance(config.get("overrides"), str):
    from assay.app import split_overrides

    config["overrides"] = split_overrides(config["overrides"])
validate(config, "workflow/schemas/workflow.schema.yaml")


include: "workflow/rules/common.smk"


wildcard_constraints:
    task=r"L\d+_[A-Za-z0-9_]+",
    llm=r"[A-Za-z0-9_-]+",
    gen=r"\d+",


rule all:
    default_target: True
    input:
        report=f"{C}/report.html",
        archive=expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        tracked=expand(f"{C}/{{llm}}/tracked.json", llm=LLMS),
        # Listed so that a deleted task folder is made again: Snakemake does not remake a
        # missing file that only feeds outputs which still exist.
        profiles=expand(f"{C}/{{llm}}/{{task}}/profile.json", llm=LLMS, task=TASKS),


onstart:
    # One run per campaign at a time. The default profile turns Snakemake's own lock off
    # (`nolock`): it survives a SIGKILL and then blocks the rerun that should resume.
    from assay.layout import hold_lock

    if not hold_lock(Path(C) / ".run.lock"):
        raise WorkflowError(f"another Snakemake run is working on {C}; wait for it to end")


include: "workflow/rules/tasks.smk"
include: "workflow/rules/translate.smk"
include: "workflow/rules/evolve.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/archive.smk"
include: "workflow/rules/report.smk"
