"""assay.process.exit_now: a pipeline process ends without the interpreter's teardown, but
with everything a normal exit would have finished: its threads, its exit callbacks, its
buffered output."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, logging, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    from assay.process import exit_now

    out = Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    log = logging.getLogger("t")
    log.addHandler(logging.FileHandler(out / "log"))
    log.warning("logged")
    pool = ThreadPoolExecutor(1)  # never shut down: its queued work still runs at exit
    pool.submit(lambda: (time.sleep(0.3), (out / "pool").write_text("done")))
    threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
    sys.stdout.write("no newline, still buffered")
    exit_now(3)
    (out / "after").write_text("exit_now returned")
""")


def test_exit_now_finishes_threads_callbacks_and_output_then_exits(tmp_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "no newline, still buffered"
    assert {p.name: p.read_text().strip() for p in tmp_path.iterdir()} == {
        "atexit": "ran", "log": "logged", "pool": "done", "thread": "done"}
