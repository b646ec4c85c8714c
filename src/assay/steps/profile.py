"""Step `profile`: profile the best accepted kernel(s) of one (llm, task).

python -m assay.steps.profile llm=offline task=L1_1_ReLU [overrides]
"""

from __future__ import annotations

import logging
import shutil
import time

from omegaconf import DictConfig

from assay import app
from assay.evolve.population import rank
from assay.evolve.state import load_members
from assay.layout import write_json

log = logging.getLogger("assay.profile")

INSTALL_CLANG_TIDY = ("Debian's clang-tidy, and libomp-dev for the OpenMP kernels: "
                      "apt-get install -y clang-tidy libomp-dev; CI does it in .ci/run")


def ncu_skipped(speedup: float, least: float) -> str | None:
    """Why ncu will not profile a best kernel of ``speedup`` over eager, or None when it will
    (``profile.ncu_min_speedup``: a campaign of hundreds of tasks may keep the device's time
    for the kernels worth studying)."""
    if least > 0 and not speedup >= least:
        return (f"ncu: not run, the best kernel is {speedup:.2f}x eager, below "
                f"profile.ncu_min_speedup={least:g}")
    return None


def tool_missing(name: str, mode: str, target: str) -> str | None:
    """Why ``name`` (ncu or clang-tidy) will not run in this step, or None when it will. The
    mode is the profile config's ``auto``/``on``/``off``; ``on`` with the tool missing is an
    error (exit 2), ``auto`` says so once in the log."""
    if mode == "off":
        return f"{name}: off (profile.{name.replace('-', '_')}=off)"
    if name == "ncu" and target == "cpu":
        return "ncu: not run, the target is cpu (ncu profiles GPU kernels)"
    if shutil.which(name) is None:
        how = INSTALL_CLANG_TIDY if name == "clang-tidy" else "NVIDIA Nsight Compute"
        why = f"{name}: not run, {name} is not on PATH (install {how})"
        if mode == "on":
            raise app.UserError(f"profile.{name.replace('-', '_')}=on but {why}")
        return why
    return None


def profile(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    llm, task_id = cfg.llm.name, cfg.task
    gens = c.generations(llm, task_id)
    members = rank([m for m in load_members(c, llm, task_id, max(gens, default=0))
                    if m.accepted])
    out = {"task": task_id, "llm": llm, "candidate": None, "ncu": None, "torch_profile": None,
           "clang_tidy": None}
    if not members:
        log.info("%s/%s: no accepted kernel to profile", llm, task_id)
        write_json(c.profile(llm, task_id), out)
        return out
    from assay.profile.tools import (clang_tidy, light, ncu_profile, torch_profile,
                                     torch_profile_table)
    from assay.verify.config import from_cfg

    best = members[0]
    path = c.candidate(llm, task_id, best.generation, best.id)
    p = cfg.profile
    vcfg = light(from_cfg(cfg.verify))  # (a profile, not a verdict: three input sets)
    device = "cuda" if tgt == "cuda" else "cpu"
    out["candidate"] = best.id
    # The verifier profiled every timed call of this candidate already (its audit): the table
    # comes from its verdict, and a worker runs again only for a verdict without it (written
    # before the verdict kept it) or for ncu (KernelBench's L1_41 on an H200: a 40 s run).
    rows = best.verdict.get("kernel_profile") if p.torch_profiler else None
    prep = None
    times: dict[str, float] = {}  # seconds per stage, kept in profile.json (evidence)

    def timed(stage: str, fn, *args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[f"{stage}_s"] = round(time.perf_counter() - t, 3)

    def prepared():  # the device taken first: preparing makes the input sets on it
        from assay.verify.harness import prepare  # (torch: only where a worker runs)

        if device == "cuda":
            # Its kernels built on the CPU cores first (the compile service, sandboxed): a
            # candidate judged on another machine has none in this one's cache, and its
            # first call in the profiled worker would build them with the device held.
            from assay.verify.compile_service import built_first

            for built in built_first([path], min(cfg.build.workers, 1), cfg.build.timeout_s,
                                     vcfg.limits).values():
                times["build_s"] = round(built.seconds, 3)
        waited = app.on_device(cfg)
        if waited is not None:
            times["device_wait_s"] = round(waited, 3)
        return timed("prepare", prepare, app.load_task(cfg, task_id, tgt), device, vcfg)

    if rows:
        log.info("%s/%s: torch profiler table of %s from its verdict", llm, task_id, best.id)
        out["torch_profile"] = ("(the verifier's audit, every timed call)\n"
                                + torch_profile_table(rows, device))
    elif p.torch_profiler:
        # On the cpu target the CPU lease covers the references and the profiled runs (their
        # per-op times); clang-tidy below runs beside another step's timing.
        with app.cpu_timing(cfg):
            prep = prepared()
            log.info("%s/%s: torch profiler on %s", llm, task_id, best.id)
            out["torch_profile"] = timed("torch_profile", torch_profile, prep, path, vcfg)
    if (why := tool_missing("ncu", p.ncu, tgt)
            or ncu_skipped(best.speedup, float(p.ncu_min_speedup))) is None:
        log.info("%s/%s: ncu on %s", llm, task_id, best.id)
        prep = prep if prep is not None else prepared()
        out["ncu"] = timed("ncu", ncu_profile, prep, path, vcfg, list(p.ncu_metrics),
                           p.timeout_s, kernels=best.verdict.get("kernels_launched") or ())
    else:
        log.info("%s", why)  # NCU_Profile stays null
    if (why := tool_missing("clang-tidy", p.clang_tidy, tgt)) is None:
        log.info("%s/%s: clang-tidy on %s", llm, task_id, best.id)
        out["clang_tidy"] = timed("clang_tidy", clang_tidy, path.read_text(), tgt, p.timeout_s)
    else:
        (log.info if p.clang_tidy == "off" else log.warning)("%s", why)  # Clang_Tidy: null
    out["times"] = times
    log.info("%s/%s: seconds per stage: %s", llm, task_id,
             ", ".join(f"{k} {v:.1f}" for k, v in times.items()) or "none")
    write_json(c.profile(llm, task_id), out)
    return out


main = app.step(profile, gpu="late", timing=True)

if __name__ == "__main__":
    app.run_script(main)
