"""Stage 1's check, run in the verifier's sandbox: does a functional rewrite compute the same
function as the task's ``Model``?

python -m assay.evolve.functional_check <scratch>
reads ``<scratch>/job.json`` (``task``: the task file copied there, ``size``, ``level``,
``rewrite``: the rewrite's file, ``sets``: [[seed, distribution], ...], ``rtol``, ``atol``) and
writes ``<scratch>/result.json``: ``accepted``, ``reasons`` (failed checks), ``detail``,
``max_abs_err``.

Checks, all on the CPU:
- ``defines``: the rewrite defines a callable ``module_fn`` and ``class Model``;
- ``parameters``: the reference's (randomized) state dict loads into the rewrite's ``Model``
  with ``strict=True`` (same parameter and buffer names and shapes);
- ``calls_module_fn``: ``Model.forward`` goes through ``module_fn`` on every call;
- ``same_outputs``: on every input set (the task's own ``get_inputs`` under fresh seeds, in
  several distributions), the same shapes and dtypes, NaN in the same places, and values
  within ``rtol``/``atol`` (atol relative to the reference's RMS) of the original.
The task's own ``get_inputs``/``get_init_inputs`` and sizes are used for both models, so a
rewrite that changed them cannot pass by changing the question.
"""

from __future__ import annotations

import json
import sys
import traceback
import types
from pathlib import Path
from typing import Any


def _fail(result: dict[str, Any], name: str, detail: str) -> dict[str, Any]:
    result["reasons"].append(name)
    result["detail"] = detail
    result["accepted"] = False
    return result


def check(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from assay.tasks.instantiate import (as_outputs, build_model, make_inputs,
                                         reference_model)
    from assay.tasks.model import Task

    result: dict[str, Any] = {"accepted": False, "reasons": [], "detail": "",
                              "max_abs_err": None, "sets": 0}
    torch.set_num_threads(1)
    task = Task.from_file(job["task"], size=job["size"], level=job.get("level"))
    orig = task.module()
    text = Path(job["rewrite"]).read_text()
    mod = types.ModuleType("assay_functional_rewrite")
    mod.__file__ = job["rewrite"]
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(text, "functional.py", "exec"), mod.__dict__)
    except Exception as e:  # noqa: BLE001 - the rewrite is untrusted code
        return _fail(result, "defines", f"executing the rewrite failed: {type(e).__name__}: {e}")
    fn = mod.__dict__.get("module_fn")
    if not callable(fn):
        return _fail(result, "defines", "the rewrite defines no function module_fn")
    if not isinstance(mod.__dict__.get("Model"), type):
        return _fail(result, "defines", "the rewrite defines no class Model")
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return fn(*args, **kwargs)

    mod.__dict__["module_fn"] = counted  # forward looks module_fn up in its globals
    rtol, atol = float(job.get("rtol", 1e-5)), float(job.get("atol", 1e-6))
    worst = 0.0
    for seed, dist in job["sets"]:
        ref = reference_model(orig, int(seed), "cpu")
        try:
            new = build_model(mod.Model, orig, int(seed), "cpu")
            new.load_state_dict(ref.state_dict(), strict=True)
        except Exception as e:  # noqa: BLE001
            return _fail(result, "parameters", f"{type(e).__name__}: {e}")
        inputs = make_inputs(orig, int(seed) + 1, "cpu", dist)
        with torch.no_grad():
            want = as_outputs(ref(*[x.clone() if isinstance(x, torch.Tensor) else x
                                    for x in inputs]))
            before = calls[0]
            try:
                got = as_outputs(new(*[x.clone() if isinstance(x, torch.Tensor) else x
                                       for x in inputs]))
            except Exception as e:  # noqa: BLE001
                return _fail(result, "runs", f"{type(e).__name__}: {e}")
        if calls[0] == before:
            return _fail(result, "calls_module_fn", "Model.forward did not call module_fn")
        if len(got) != len(want):
            return _fail(result, "same_outputs", f"{len(got)} outputs, expected {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            if g.shape != w.shape or g.dtype != w.dtype:
                return _fail(result, "same_outputs",
                             f"output {i}: {tuple(g.shape)} {g.dtype}, expected "
                             f"{tuple(w.shape)} {w.dtype}")
            if not w.is_floating_point():
                if not torch.equal(g, w):
                    return _fail(result, "same_outputs", f"output {i}: values differ")
                continue
            if not torch.equal(torch.isnan(g), torch.isnan(w)):
                return _fail(result, "same_outputs", f"output {i}: NaN in other places")
            ok = ~torch.isnan(w)
            g64, w64 = g[ok].double(), w[ok].double()
            if w64.numel() == 0:
                continue
            err = (g64 - w64).abs()
            rms = float(w64.pow(2).mean().sqrt())
            worst = max(worst, float(err.max()))
            bound = rtol * w64.abs() + atol * max(rms, 1e-30)
            if bool((err > bound).any()):
                return _fail(result, "same_outputs",
                             f"output {i}: max abs error {float(err.max()):.3g} (input set "
                             f"seed {seed}, {dist}) beyond rtol {rtol:g}, atol {atol:g} x RMS")
        result["sets"] += 1
    result["max_abs_err"] = worst
    result["accepted"] = True
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    scratch = Path(argv[0])
    job = json.loads((scratch / "job.json").read_text())
    try:
        result = check(job)
    except Exception as e:  # noqa: BLE001 - reported, never raised to the step
        result = {"accepted": False, "reasons": ["error"],
                  "detail": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"}
    (scratch / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
