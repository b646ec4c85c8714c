"""The campaign's steps: one module per Snakemake rule, named after it.

``python -m assay.steps <rule> [hydra overrides]`` is the command of rule ``<rule>``
(``workflow/rules/*.smk``): ``__main__.py`` hands the step to the step server
(:mod:`assay.stepserver`), and ``python -m assay.steps.<rule>`` runs the same step in its own
process. Each module is a thin Hydra entry point (``assay.app.step``): it
reads the files its rule declares, calls the library packages (tasks, bench, verify, propose,
evolve, profile, archive, track, report) and writes its rule's outputs. The packages never
import a step, so the arrows run one way: steps -> packages.
"""

# The rules, each a module of this package (``python -m assay.steps <rule>`` runs one).
RULES = ("device", "extract", "baseline", "translate", "evolve", "verify", "profile", "track",
         "export", "report")
