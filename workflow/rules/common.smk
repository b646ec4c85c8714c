# Shared by all the rules: the composed Hydra config, the campaign folder, tasks, LLMs, levels.
import shlex
import sys

from assay.app import compose, target, task_refs

OVERRIDES = [str(o) for o in config.get("overrides", [])]
CFG = compose(OVERRIDES)
C = f"{CFG.results_dir}/{CFG.campaign}"
LLMS = [str(x) for x in CFG.llms]
GENS = int(CFG.evolve.generations)
REFS, TASK_ERRORS = task_refs(CFG)
for _err in TASK_ERRORS:
    print(f"assay: task left out: {_err}", file=sys.stderr)
TASKS = [r.id for r in REFS]
# Every file a step reads under the campaign folder is an input of its rule. Outside it, read
# and not declared: the task files (tasks.source; the steps that run a task load its file, and
# a checkout that touches them must not redo finished campaigns) and what each rule's comment
# names (caches, the MLflow store, other campaigns).
LEVELS = sorted({r.level for r in REFS})
# GPU steps hold one GPU each (`--resources gpu=N`); the lease in assay.gpu picks which. On the
# cpu target they hold none, so they run side by side. `target=auto` is resolved here, on the
# machine running Snakemake: a cluster whose login node has no GPU needs `target=cuda`.
GPU = 1 if target(CFG) == "cuda" else 0
# Passed to every step through `params` (not spelled into the shell command), so the rules'
# code is the same whatever the overrides; the default profile leaves `params` out of the rerun
# triggers: a campaign's settings are those of its first run (see the README).
OVR = " ".join(shlex.quote(o) for o in OVERRIDES)
# On the cpu target every timing step (device, baseline, verify, profile) holds the `cpu_timing`
# resource, which the default profile caps at 2: one step times while it holds the CPU lease of
# assay.gpu (taken around its timed part only: two timings never share the cores), the next
# gets ready beside it.
CPU_TIMING = 1 - GPU
# ... and as many of Snakemake's cores as it computes on (`target.cpu_threads`; 0: all of them),
# so no other job of the campaign shares those cores while it times.
TIMING_THREADS = 1 if GPU else (int(CFG.target.cpu_threads) or workflow.cores)
# `--use-conda` builds this environment for each step; by default the current one is used.
ENV = "../../environment.yml"


def generations(llm, task, gens):
    """What translate, evolve and verify leave of generations ``gens`` of one (llm, task):
    proposals.json, candidates/ and verdicts.json. A step that reads a generation's verdicts
    reads the per-candidate gen_<g>/verdicts/ beside verdicts.json: verify writes that folder
    with it, undeclared (verify.smk says why)."""
    return [f"{C}/{llm}/{task}/gen_{g}/{name}" for g in gens
            for name in ("proposals.json", "candidates", "verdicts.json")]


def every_generation(llms):
    """``generations`` of every task of these backends, all generations."""
    return [f for llm in llms for task in TASKS for f in generations(llm, task, range(GENS + 1))]


def assay_step(step, **params):
    """The shell command of one rule: its step ``python -m assay.steps <step>`` (the module
    ``assay.steps.<step>``, named after the rule, forked by the step server: see
    assay/stepserver.py) with the campaign's overrides plus this job's own."""
    own = " ".join(f"{k}={v}" for k, v in params.items())
    # The interpreter running Snakemake: the one with assay installed (`python` may not exist).
    return f"{shlex.quote(sys.executable)} -m assay.steps {step} {{params.overrides}} {own}"
