"""``python -m assay.steps <rule> [hydra overrides]``: the command of every rule of the DAG.

The step ``assay.steps.<rule>`` runs on the step server (:mod:`assay.stepserver`: forked from a
process that imported torch already, with this process's environment, folder and streams;
this process waits for it, passes signals on and exits with its status), or here where there
is none (``ASSAY_STEP_SERVER=0``, SLURM, or a server that could not start: one line says so).
``python -m assay.steps.<rule>`` runs it here always.
"""

from __future__ import annotations

import os
import signal
import sys

from assay.steps import RULES


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in RULES:
        print(f"usage: python -m assay.steps RULE [overrides...]; RULE is one of "
              f"{', '.join(RULES)}", file=sys.stderr)
        sys.exit(2)
    rule, args = argv[0], argv[1:]
    from assay import stepserver

    if stepserver.wanted():
        try:
            code = stepserver.run_step(rule, args)
        except stepserver.NoServer as e:
            print(f"assay: step {rule} runs in this process: {e}", file=sys.stderr)
        else:
            if code < 0:  # ended by a signal: so does this process, as the step's would
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            sys.exit(code if code >= 0 else 128 - code)
    stepserver.run_here(rule, args)


if __name__ == "__main__":
    main(sys.argv[1:])
