"""How a pipeline process ends once its work is written.

A process that has imported torch spends about a second of CPU in the interpreter's teardown,
freeing its modules and their objects one by one (on the 2-core CPU machine `python -c "import
torch"` took 3.2-3.8 s, 2.4 s when it ended with ``os._exit``). Every step, task record and
`assay` command pays it once, and a campaign runs hundreds of them. :func:`exit_now` skips it
after doing what a normal exit does that anyone could see. (The verifier's worker ends with
``os._exit`` too, but without running exit callbacks: there a candidate could have registered
some.)
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int = 0) -> NoReturn:
    """End the process with ``code`` as the interpreter's exit would, less its teardown:
    threads finished (executors told to stop first, non-daemon threads joined), atexit
    callbacks run (logging's handlers flushed and closed, MLflow's, multiprocessing's), the
    standard streams flushed. Where this Python lacks the hooks used, a normal exit."""
    shutdown = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None or \
            threading.current_thread() is not threading.main_thread():
        sys.exit(code)
    shutdown()  # what the interpreter does first at exit: threading's own exit hooks, joins
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(code)
