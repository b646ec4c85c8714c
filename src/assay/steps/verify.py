"""Step `verify`: judge every candidate of one generation of one (llm, task).

python -m assay.steps.verify llm=offline task=L1_1_ReLU gen=0 [overrides]
Each verdict is written as soon as it is decided; a rerun skips candidates already judged, so
a killed run loses nothing and judges nothing twice. A verdict older than the generation's
proposals.json or the task's baseline is stale (a forced rerun rewrote them): judged again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from assay import app
from assay.layout import Campaign, is_fresh, read_json, write_json

log = logging.getLogger("assay.verify")


def drop_stale_verdicts(c: Campaign, llm: str, task: str, gen: int,
                        inputs: tuple[Path, ...]) -> int:
    """Remove the generation's verdicts older than ``inputs`` (judged against earlier proposals
    or another baseline), so that nothing reads them as current: the population, another task's
    stepping stones, the archive; returns how many."""
    n = 0
    vdir = c.verdicts_dir(llm, task, gen)
    for path in sorted(vdir.glob("*.json")) if vdir.is_dir() else []:
        if not is_fresh(path, *inputs):
            path.unlink()
            n += 1
    return n


def other_device(named: str | None, here: str) -> str:
    """Why timings taken on the GPU ``named`` (None: a file that does not say) are not this
    GPU's (``here``), "" where they are. A campaign resumed on another GPU, or a cluster's jobs
    on several kinds, must not divide one GPU's time by another's."""
    if named == here:
        return ""
    return f"timed on {named}, not on this {here}" if named else \
        f"timed on a GPU it does not name, not necessarily this {here}"


def peaks_used(peaks: dict | None) -> dict | None:
    """The device peaks a verdict's roofline was drawn against (this GPU's where the campaign's
    were another's: :func:`this_gpu`), kept in the verdict so that what reads it later (the
    evolution's profile of a parent, the report) uses the GPU it was timed on."""
    if not peaks:
        return None
    return {k: peaks.get(k) for k in ("name", "bandwidth_gbs", "flops_tflops")}


def outcome(v) -> str:
    """A verdict in a few words, for the log."""
    if not v.accepted:
        return f"rejected: {', '.join(v.reasons)}"
    return f"accepted, {v.speedup_eager:.2f}x eager" if v.speedup_eager else "accepted"


def judge(cfg: DictConfig, c: Campaign, llm: str, task_id: str, gen: int,
          todo: list[str]) -> None:
    """Verify the candidates ``todo`` of one generation, writing each verdict when decided."""
    from assay.verify.config import from_cfg  # (no torch, nor the next)
    from assay.verify.sandbox import prestart_worker

    vcfg = from_cfg(cfg.verify)
    record = read_json(c.task_record(task_id))
    degenerate = bool(record.get("degeneracy", {}).get("degenerate"))
    # every verdict decided by the task's record: no build, no worker, no GPU (KernelBench's
    # L1_49 waited 9 s for the GPU and built two kernels to be told so)
    by_record = degenerate and vcfg.on_degenerate == "reject"
    if not by_record:
        # The workers' zygote imports torch now, beside this step's own import, the builds and
        # the preparation: started by the first verification, its import (2.5 s on the CPU
        # machine, 4-5 s on an H200) came after them, while the step held the CPU lease or
        # the device.
        prestart_worker()
    # torch is imported only when there is something to judge: an empty generation (a declined
    # task) costs a second, not the three of a torch import.
    from assay.verify.compile_service import built_first
    from assay.verify.harness import prepare, reportable_times, verify
    from assay.verify.memory import TooLarge

    tgt = app.target(cfg)
    device = "cuda" if tgt == "cuda" else "cpu"
    task = app.load_task(cfg, task_id, tgt)
    baseline = read_json(c.baseline(task_id))
    peaks = read_json(c.device()) if c.device().exists() else None
    paths = {cid: c.candidate(llm, task_id, gen, cid) for cid in todo}
    builds: dict = {}  # path -> its build (cuda: all before the device is taken)

    def decide(prepared=None, shared: dict | None = None) -> None:
        """Each verdict, written as soon as it is decided; ``shared``: the seconds spent once
        for the whole generation (the wait for the device, the shared preparation), kept in
        every verdict's times."""
        for i, cid in enumerate(todo, 1):
            t0 = time.perf_counter()
            built = builds.get(str(paths[cid]))
            built_s = built.seconds if built else 0.0
            times: dict = dict(shared or {})  # where the seconds went, kept in the verdict file
            v = verify(task, paths[cid], device, vcfg, baseline, record, peaks, prepared,
                       times=times)
            write_json(c.verdict(llm, task_id, gen, cid),
                       {**v.to_dict(), "baseline_device": baseline.get("device_name"),
                        "device_peaks": peaks_used(peaks),
                        "times": reportable_times(times)})
            log.info("%s/%s gen %d [%d/%d] %s %s (build %.1f s, verify %.1f s)", llm,
                     task_id, gen, i, len(todo), cid, outcome(v), built_s,
                     time.perf_counter() - t0)

    if by_record:
        decide()
        return
    # On cuda, kernels build on the CPU cores, every candidate's before the device is taken
    # (another job uses it meanwhile; a build waited for with it held would leave it idle). On
    # the cpu target the builds would share the cores being timed, so each worker builds its
    # own, untimed.
    shared = {}
    if device == "cuda":
        builds = built_first([paths[cid] for cid in todo], cfg.build.workers,
                             cfg.build.timeout_s, vcfg.limits)
        prewarmed_baseline(cfg, task, baseline, shared)
    # On the cpu target the CPU lease covers the references (float64, memory-bound) and the
    # verifications; the imports above and the teardown run beside another step's timing.
    if (waited := app.on_device(cfg)) is not None:
        shared["device_wait_s"] = waited
    if device == "cuda":  # speedups of one GPU's times only
        baseline, peaks = this_gpu(cfg, task, baseline, peaks, shared)
    with app.cpu_timing(cfg):
        prepared = None
        if not degenerate:
            t = time.perf_counter()
            try:
                prepared = prepare(task, device, vcfg)
            except TooLarge as e:  # each verdict says too_large, with the numbers
                log.warning("%s: too large for this machine: %s", task_id, e)
            # once per generation, before its first candidate (the harness keeps it)
            shared |= {"prepare_s": time.perf_counter() - t, "prepare_shared_by": len(todo)}
        decide(prepared, shared)


def prewarmed_baseline(cfg: DictConfig, task, baseline: dict, shared: dict) -> None:
    """Before the device is taken: where :func:`this_gpu` will time the task's baseline again
    (the campaign's was another GPU's, and this one's is not cached), torch.compile's compile
    of it on fake tensors first (``baselines.prewarm``, as the baseline step does), so that
    the compile with the device held is a cache hit; what it took in ``shared``."""
    if not (cfg.baselines.compile and cfg.baselines.prewarm) or baseline.get("eager_ms") is None:
        return
    from assay.bench.baseline_cache import baseline_is_cached
    from assay.bench.device import device_name
    from assay.bench.prewarm import prewarm_before_lease
    from assay.bench.timing import TimingConfig

    if not other_device(baseline.get("device_name"), device_name("cuda")) or \
            baseline_is_cached(task, "cuda", TimingConfig.of(cfg.verify), cfg.baselines.compile,
                               cfg.baselines.compile_mode):
        return
    warm = prewarm_before_lease(task, "cuda", cfg.baselines.compile_mode, log)
    shared["baseline_prewarm_s"] = warm["seconds"]
    if warm.get("error"):
        shared["baseline_prewarm_error"] = warm["error"]


def this_gpu(cfg: DictConfig, task, baseline: dict, peaks: dict | None, shared: dict
             ) -> tuple[dict, dict | None]:
    """The task's baseline and the device's peaks as this GPU gives them: where the campaign's
    were measured on another (or do not say where), this GPU's, timed once per (task, GPU,
    torch version) in the baseline cache and measured once per GPU; the seconds it took in
    ``shared``. (The device is taken already: torch.compile's compile holds it, as in the
    baseline step, whose warm-up runs on it.)"""
    from assay.bench.baseline import baseline_here
    from assay.bench.device import device_name, peaks as device_peaks
    from assay.bench.timing import TimingConfig

    here = device_name("cuda")
    if peaks is not None and (why := other_device(peaks.get("name"), here)):
        log.warning("%s: the campaign's device peaks were %s: this GPU's are used", task.id, why)
        peaks = device_peaks("cuda")
    if baseline.get("eager_ms") is None \
            or not (why := other_device(baseline.get("device_name"), here)):
        return baseline, peaks
    t = time.perf_counter()
    tcfg = TimingConfig.of(cfg.verify)
    timed, cached = baseline_here(task, tcfg, cfg.baselines.compile, cfg.baselines.compile_mode)
    # (in every verdict's times: which baseline its speedups divide by, and why)
    shared["baseline_here_s"] = time.perf_counter() - t
    if not cached and isinstance(timed.get("compile_s"), (int, float)):
        shared["baseline_compile_s"] = timed["compile_s"]  # of it, the compile (held)
        shared["baseline_compile_cache_hit"] = bool(timed.get("fxgraph_cache", {}).get("hit"))
    shared["baseline_retimed"] = f"the campaign's baseline was {why}"
    log.warning("%s: its baseline was %s: this GPU's is used (%s), eager %s ms", task.id, why,
                "cached" if cached else "timed now", timed.get("eager_ms"))
    return {**timed, "device_name": here}, peaks


def verify_generation(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    llm, task_id, gen = cfg.llm.name, cfg.task, int(cfg.gen)
    ids = read_json(c.proposals(llm, task_id, gen))["candidates"]
    # A verdict counts only when written after the proposals and the baseline it was judged
    # against: a forced rerun of translation, evolution or the baseline judges again.
    inputs = (c.proposals(llm, task_id, gen), c.baseline(task_id))
    stale = drop_stale_verdicts(c, llm, task_id, gen, inputs)
    todo = [cid for cid in ids if not c.verdict(llm, task_id, gen, cid).exists()]
    log.info("%s/%s gen %d: %d candidates, %d already judged%s", llm, task_id, gen, len(ids),
             len(ids) - len(todo), f", {stale} stale verdict(s) removed" if stale else "")
    if todo:
        judge(cfg, c, llm, task_id, gen, todo)
    verdicts = [read_json(c.verdict(llm, task_id, gen, cid)) for cid in ids]
    summary = {"generation": gen, "candidates": ids,
               "accepted": [v["candidate"] for v in verdicts if v["accepted"]],
               "best_speedup_eager": max((v["speedup_eager"] or 0 for v in verdicts
                                          if v["accepted"]), default=None)}
    write_json(c.verdicts(llm, task_id, gen), summary)
    return summary


main = app.step(verify_generation, gpu="late", timing=True)

if __name__ == "__main__":
    app.run_script(main)
