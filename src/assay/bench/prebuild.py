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
    """Build the libraries of a candidate that declares them as ``SOURCES`` in ``LANG`` (the
    offline synthesizer's, which loads each at its first call, so its import builds none):
    without this, nvcc ran in the verifying worker's first call with the device held (first
    calls were 62% of level 2's worker time on an H200,
    docs/evidence/2026-12-07-h200-kb-dag-tenth.md)."""
    from assay.bench.build import LANGS, build_all

    sources, lang = getattr(mod, "SOURCES", None), getattr(mod, "LANG", None)
    if isinstance(sources, tuple) and all(isinstance(s, str) for s in sources) \
            and lang in LANGS:
        build_all(sources, lang)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
