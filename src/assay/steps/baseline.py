"""Step `baseline`: eager and torch.compile timings of one task (``baselines/<task>.json``).

python -m assay.steps.baseline task=L1_1_ReLU [overrides]

Timed in a process that never loads a candidate; every verdict's speedup is computed against it.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.layout import read_json, write_json

log = logging.getLogger("assay.baseline")


def baseline(cfg: DictConfig) -> dict:
    if cfg.task is None:
        raise app.UserError("the baseline step times one task: give task=<id>")
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    record = read_json(c.task_record(cfg.task))
    if record.get("error"):
        out = {"task": cfg.task, "skipped": record["error"], "eager_ms": None, "compile_ms": None}
        write_json(c.baseline(cfg.task), out)
        return out
    # torch (2-3 s of imports) only for a task that is timed, not for one skipped above
    from assay.bench.baseline import NOISY_IQR, time_reference
    from assay.bench.timing import TimingConfig

    device = "cuda" if tgt == "cuda" else "cpu"
    task = app.load_task(cfg, cfg.task, tgt)
    tcfg = TimingConfig.of(cfg.verify)
    warm = None
    if device == "cuda" and cfg.baselines.compile and cfg.baselines.prewarm:
        # inductor's and Triton's caches filled by a compile on fake tensors, beside another
        # job's use of the device: the compile below, with the device held, loads them
        from assay.bench.prewarm import prewarm_before_lease

        warm = prewarm_before_lease(task, device, cfg.baselines.compile_mode, log)
    app.on_device(cfg)  # (its imports, torch.compile's among them, ran beside another job)
    log.info("%s: timing eager%s on %s", task.id,
             " and torch.compile" if cfg.baselines.compile else "", device)
    out = time_reference(task, device, tcfg, cfg.baselines.compile, cfg.baselines.compile_mode,
                         hold=lambda: app.cpu_timing(cfg))
    if warm is not None:
        out["prewarm"] = warm
    out["target"] = tgt
    out["kernels"] = app.kernel_target(cfg, tgt)  # triton on target=triton, else the device's
    if device == "cuda":  # which GPU: the verify step times the baseline again on another
        from assay.bench.device import device_name

        out["device_name"] = device_name(device)
    write_json(c.baseline(cfg.task), out)
    app.off_device()
    log.info("%s: eager %s, compile %s", task.id,
             *(f"{out[k]:.4g} ms" if isinstance(out.get(k), (int, float)) else "not timed"
               for k in ("eager_ms", "compile_ms")))
    if "compile_s" in out:
        log.info("%s: torch.compile compiled in %.1f s with the device held (FX-graph cache: "
                 "%d hit, %d miss)", task.id, out["compile_s"], out["fxgraph_cache"]["hit"],
                 out["fxgraph_cache"]["miss"])
    for name in ("eager", "compile"):
        ms, iqr = out.get(f"{name}_ms"), out.get(f"{name}_iqr_ms")
        if ms and iqr and iqr > NOISY_IQR * ms:  # still noisy after the retries of `steady`
            log.warning("%s: %s timed at %.4g ms with an IQR of %.0f%% of it: the machine was "
                        "busy, and every speedup against this baseline is as uncertain (re-time "
                        "it on a quiet machine: --forcerun %s)", task.id, name, ms,
                        100 * iqr / ms, c.baseline(cfg.task))
    return out


main = app.step(baseline, gpu="late", timing=True)

if __name__ == "__main__":
    app.run_script(main)
