"""Import a candidate in build-only mode so its kernels land in the build cache.

python -m assay.bench.prebuild CANDIDATE.py   (run by the compile service, sandboxed, no GPU)
Exit 0 when the import finished, 1 when the candidate failed to build or import: either way
the verifier decides later; this only moves compile time off the GPU's critical path.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def main(argv: list[str]) -> int:
    os.environ["ASSAY_BUILD_ONLY"] = "1"
    from assay.bench import inline

    inline.install()  # load_inline candidates fill the content-hash cache too
    spec = importlib.util.spec_from_file_location("assay_prebuild_candidate", argv[0])
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        _offline_libraries(mod)
    except BaseException as e:  # noqa: BLE001 - candidate code; the verifier judges it
        print(f"prebuild: {type(e).__name__}: {e}"[:2000], file=sys.stderr)
        return 1
    return 0


def _offline_libraries(mod) -> None:
    """Build each library of a candidate the offline synthesizer wrote before 2026-12-07: those
    load their libraries (``SOURCES``, through ``_lib(i)``) at the first call only, where nvcc
    then ran in the verifying worker with the device held; later ones build them at import in
    build-only mode. Candidates the DAG made earlier are still verified."""
    sources, lib = getattr(mod, "SOURCES", None), getattr(mod, "_lib", None)
    if isinstance(sources, tuple) and all(isinstance(s, str) for s in sources) \
            and callable(lib):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 1) // 4))) as pool:
            list(pool.map(lib, range(len(sources))))  # (as the later ones do at import)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
