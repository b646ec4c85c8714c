"""The cpu out-of-process observer (verify/observer.py): samples of another process's threads
taken by the harness, placed in the files their code came from, against what a report says."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from assay.verify import observer
from assay.bench import timing
from assay.verify.observer import Sampled, disagreement, shares, timing_disagreement

TORCH_SO = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
MINE_SO = "/tmp/kernels/softmax-abc/lib.so"
GOMP_SO = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"


def _sampled(where: list[tuple[int, str]]) -> Sampled:
    """Samples at times 0, 1, 2, ... in process 7, at an address of each named file."""
    base = {TORCH_SO: 0x1000, MINE_SO: 0x5000, GOMP_SO: 0x9000}
    s = Sampled(maps={7: sorted((lo, lo + 0x1000, path) for path, lo in base.items())},
                threads=2)
    for t, path in where:
        s.add(t, base[path] + 0x10, 7)
    return s


def _calls(n: int, aten_share: float, width: int = 100) -> list[dict]:
    """Timed calls of ``width`` ns each (1e-3 us a ns), back to back from time 0."""
    return [{"window_ns": [i * width, (i + 1) * width - 1],
             "rows": [{"name": "aten::softmax", "cpu_us": aten_share * width / 1e3}]}
            for i in range(n)]


def test_samples_are_counted_by_the_file_their_code_came_from_within_the_windows():
    s = _sampled([(5, TORCH_SO), (6, MINE_SO), (7, GOMP_SO), (500, TORCH_SO)])
    s.add(8, 0xDEAD0000, 7)  # outside every mapping read: counted apart, in neither share
    assert shares(s, [(0, 99)]) == {"torch": 1, "openmp": 1, "unplaced": 1, "other": 1}
    assert shares(s, [(400, 600)]) == {"torch": 1, "openmp": 0, "unplaced": 0, "other": 0}


def test_a_report_that_hides_library_work_disagrees_and_an_honest_one_agrees():
    library = _sampled([(t, TORCH_SO if t % 10 else MINE_SO) for t in range(1000)])
    ok, detail = disagreement(library, _calls(10, 0.0))
    assert not ok and "rewritten" in detail
    assert "90% of their wall time in torch's libraries" in detail
    # the same samples where the report gives ATen its share of each call
    assert disagreement(library, _calls(10, 0.9))[0]
    own = _sampled([(t, MINE_SO if t % 10 else TORCH_SO) for t in range(1000)])
    ok, detail = disagreement(own, _calls(10, 0.0))
    assert ok and "10% of their wall time in torch's libraries" in detail


def test_the_share_is_of_wall_time_and_of_the_calls_upper_quartile():
    """Four threads in a BLAS call give four samples per period where one thread in the
    candidate's code gives one: 100 us in torch on four threads and 100 us in the candidate's
    code on one is half and half. Calls a preemption stretched in the candidate's Python report
    a smaller ATen share; the upper quartile of the calls is the one compared."""
    period = observer.PERIOD_NS
    where = [(t * period + k, TORCH_SO) for t in range(0, 200, 2) for k in range(4)]
    where += [(t * period, MINE_SO) for t in range(1, 200, 2)]
    s = _sampled(where)
    assert shares(s, [(0, 200 * period)])["torch"] == 400
    assert observer.torch_wall_share(s, [(0, 200 * period)]) == pytest.approx(0.5)
    calls = _calls(20, 0.5, width=10 * period)
    for c in calls[:12]:  # most calls preempted between their ATen ops
        c["rows"][0]["cpu_us"] /= 4
    ok, detail = disagreement(s, calls)
    assert ok and "50% of their wall time" in detail and "gives ATen ops 50%" in detail, detail
    assert observer.upper_quartile([0.1, 0.2, 0.3, 0.4]) == 0.4
    assert observer.upper_quartile([]) == 0.0


def test_too_few_samples_off_and_missing_windows_are_said():
    few = _sampled([(t, TORCH_SO) for t in range(0, 1000, 50)])
    ok, detail = disagreement(few, _calls(10, 0.0))
    assert ok and "too few" in detail
    off = Sampled(why_off="Operation not permitted")
    assert disagreement(off, _calls(3, 0.0)) == (
        True, "out-of-process observer off: Operation not permitted")
    calls = _calls(10, 0.0)
    del calls[3]["window_ns"]
    ok, detail = disagreement(_sampled([(1, TORCH_SO)]), calls)
    assert not ok and "no time windows" in detail


def _timed(per_call_ms: list[float], gap_ns: int = 1_000_000, window_ms: float | None = None,
           start: int = 10**9) -> tuple[dict, list[dict]]:
    """A cpu report's timing (two rounds) and its timed calls: call i is timed at
    ``per_call_ms[i]`` and its window spans ``window_ms`` (default: the call's time less 2 us)
    inside it, ``gap_ns`` after the last."""
    calls, t = [], start
    for ms in per_call_ms:
        span = int(((window_ms if window_ms is not None else ms) - 0.002) * 1e6)
        calls.append({"window_ns": [t, t + span], "rows": []})
        t += span + gap_ns
    half = len(per_call_ms) // 2
    reported = timing.cpu_timing([per_call_ms[:half], per_call_ms[half:]]).to_dict()
    return reported, calls


def _own_samples(calls: list[dict], where: str, between: bool) -> Sampled:
    """Ten samples at ``where`` inside each timed call's window, or ten in each gap after one."""
    s = _sampled([])
    base = {TORCH_SO: 0x1000, MINE_SO: 0x5000, GOMP_SO: 0x9000}[where]
    for c, nxt in zip(calls, calls[1:]):
        a, b = (c["window_ns"][1], nxt["window_ns"][0]) if between else c["window_ns"]
        for k in range(1, 11):
            s.add(a + (b - a) * k // 11, base + 0x10, 7)
    return s


def test_an_honest_timing_agrees_with_its_windows_and_its_samples():
    reported, calls = _timed([1.0 + 0.01 * (i % 7) for i in range(40)])
    ok, detail = timing_disagreement(reported, calls, _own_samples(calls, MINE_SO, False),
                                     ("/tmp/kernels",))
    assert ok and "390 samples of the candidate's own code in its 40 timed calls, 0 between" \
        in detail, detail
    # torch's work between calls is the worker's own (flushes, input swaps): not the candidate's
    assert timing_disagreement(reported, calls, _own_samples(calls, TORCH_SO, True))[0]
    assert timing_disagreement(reported, calls, Sampled(why_off="refused")) == (
        True, "per-call times agree with the windows; out-of-process observer off: refused")


def test_a_rewritten_median_or_shortened_call_times_are_caught_without_samples():
    reported, calls = _timed([1.0] * 40)
    off = Sampled(why_off="refused")
    ok, detail = timing_disagreement({**reported, "median_ms": 0.5}, calls, off)
    assert not ok and "not the 1 ms its own per-call times give" in detail
    halved = timing.cpu_timing([[0.5] * 20, [0.5] * 20]).to_dict()
    ok, detail = timing_disagreement(halved, calls, off)
    assert not ok and "40 of 40 timed calls are reported shorter" in detail
    del reported["calls_ms"]
    ok, detail = timing_disagreement(reported, calls, off)
    assert not ok and "no per-call times" in detail


def test_the_candidates_code_between_timed_calls_is_work_moved_out_of_them():
    # times and windows shortened together: only the samples tell
    reported, calls = _timed([0.4] * 40, gap_ns=600_000)
    ok, detail = timing_disagreement(reported, calls, _own_samples(calls, MINE_SO, True),
                                     ("/tmp/kernels",))
    assert not ok and "0 samples of the candidate's own code in its 40 timed calls, 390 between " \
        "them (390 in lib.so): its work ran outside the windows timed" in detail, detail
    # a library outside every trusted folder is the candidate's too, its own folders unnamed
    assert not timing_disagreement(reported, calls, _own_samples(calls, MINE_SO, True))[0]
    # OpenMP's idle spinning between calls is not
    assert timing_disagreement(reported, calls, _own_samples(calls, GOMP_SO, True))[0]


def test_code_in_no_mapping_seen_between_calls_is_the_candidates_whatever_was_lost():
    """Every mapping an attached thread makes is in the kernel's records, so an address in none
    is code a short-lived thread mapped (a library hidden from the harness): between calls it
    counts as the candidate's, lost samples or not (a flood of them cannot switch the rule
    off: the mappings have a ring of their own), and lost mapping records or not (only a flood
    of executable mappings loses them: the candidate's own doing)."""
    reported, calls = _timed([0.4] * 40, gap_ns=600_000)
    unseen = _own_samples(calls, MINE_SO, True)
    unseen.maps[7] = [m for m in unseen.maps[7] if m[2] != MINE_SO]
    ok, detail = timing_disagreement(reported, calls, unseen, ("/tmp/kernels",))
    assert not ok and "390 between them (390 in no mapping seen)" in detail, detail
    unseen.lost = 20_000
    ok, detail = timing_disagreement(reported, calls, unseen, ("/tmp/kernels",))
    assert not ok and "390 between them (390 in no mapping seen)" in detail, detail
    unseen.lost_maps = 3
    ok, detail = timing_disagreement(reported, calls, unseen, ("/tmp/kernels",))
    assert not ok and "390 in no mapping seen; 3 mapping records lost" in detail, detail


CHILD = """
import ctypes, time, sys
import torch
x = torch.randn(256, 4096)
libc = ctypes.CDLL(None)
libc.prctl(31, 0, 0, 0, 0)  # PR_TASK_PERF_EVENTS_DISABLE: events it does not own run on
t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    if sys.argv[1] == "torch":
        torch.softmax(x, dim=-1)
    else:
        sum(i * i for i in range(1000))
print(t0, time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)
"""


@pytest.mark.skipif(bool(observer.available()), reason=f"perf_event_open refused here: "
                    f"{observer.available()}")
@pytest.mark.parametrize("work", ["torch", "python"])
def test_the_observer_sees_where_another_process_computes(work):
    """A process computing with torch.softmax is seen in torch's libraries, one in Python's
    loops is not; the process's own prctl cannot stop events the harness owns."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), work],
                             stdout=subprocess.PIPE, text=True)
    sampler = observer.CpuSampler()
    sampler.attach(child.pid)
    out, _ = child.communicate(timeout=120)
    sampled = sampler.stop()
    start, end = (int(x) for x in out.split())
    counts = shares(sampled, [(start, end)])
    counted = counts["torch"] + counts["other"]
    assert sampled.threads >= 1 and counted >= 200, (counts, sampled.lost)
    share = counts["torch"] / counted
    assert share > 0.6 if work == "torch" else share < 0.1, counts


def test_a_thread_exiting_as_it_is_attached_leaves_the_observer_on(monkeypatch):
    """The kernel answers ESRCH for a thread that is exiting while its ``/proc`` entry is still
    there (CI saw the observer switched off so, and the forged report caught by the timing
    check alone): such a thread is passed over for now, and the observer stays on.
    Any other refusal still switches it off, with the kernel's reason."""
    import errno
    calls = []

    def rings(tid, fail):
        calls.append(tid)
        if len(calls) == 1:
            raise OSError(fail, os.strerror(fail))
        return []

    for fail, off in ((errno.ESRCH, ""), (errno.EACCES, os.strerror(errno.EACCES))):
        calls.clear()
        monkeypatch.setattr(observer, "_thread_rings", lambda tid: rings(tid, fail))
        monkeypatch.setattr(observer, "_descendants", lambda root: [root])
        monkeypatch.setattr(observer, "_threads", lambda pid: [pid, pid + 1])
        monkeypatch.setattr(observer, "executable_maps", lambda pid: [])
        sampler = observer.CpuSampler()
        sampler.attach(os.getpid())
        deadline = time.monotonic() + 10
        while len(calls) < 3 and not sampler.out.why_off and time.monotonic() < deadline:
            time.sleep(0.01)
        sampled = sampler.stop()
        assert sampled.why_off == off, (fail, sampled.why_off)
        # (an exiting thread still listed is tried again at the next poll)
        assert sampled.threads == (0 if off else 2), (fail, sampled.threads)


def test_mappings_read_again_replace_what_they_overlap_and_keep_the_rest(monkeypatch):
    """An exec or a new library: the spans read later win where they overlap older ones; an
    older span they do not touch (a library since unmapped) stays, so its samples are placed."""
    sampler = observer.CpuSampler()
    sampler.out.maps[1] = [(0, 10, "a"), (12, 18, "gone"), (20, 30, "b"), (40, 50, "c")]
    monkeypatch.setattr(observer, "executable_maps", lambda pid: [(5, 8, "x"), (25, 45, "y")])
    sampler._read_maps(1)
    assert sampler.out.maps[1] == [(5, 8, "x"), (12, 18, "gone"), (25, 45, "y")]
    assert sampler.out.where(1, 13) == "gone" and sampler.out.where(1, 2) == "?"


# The spin counts the thread's own CPU time, not the wall's: the samples (one per 100 us of that
# time) then number ~4000 however loaded the machine is, and a ring of one page drained every
# 0.3 s loses most of them (a wall-clock spin on a busy CI machine gave too few to flood)
LATE_LIBRARY = r"""
#include <time.h>
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
double spin(double seconds) {
  volatile double x = 0; double end = now() + seconds;
  while (now() < end) for (int i = 0; i < 1000; ++i) x += i * 0.5;
  return x;
}
"""

LATE_CHILD = """
import ctypes, mmap, os, sys, time
sys.stdin.readline()  # the harness has attached
# a flood of executable mappings first (the mappings' ring overflows: its records are lost)
flood = [mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
         for _ in range(int(sys.argv[2]))]
lib = ctypes.CDLL(sys.argv[1])
lib.spin.argtypes, lib.spin.restype = [ctypes.c_double], ctypes.c_double
t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
lib.spin(0.4)
print(t0, time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)
os._exit(0)  # gone at once: no read of its maps after the library came
"""


@pytest.mark.skipif(bool(observer.available()), reason=f"perf_event_open refused here: "
                    f"{observer.available()}")
@pytest.mark.parametrize("flood", ["", "samples", "mappings"],
                         ids=["drained", "samples_flooded", "mappings_flooded"])
def test_a_library_loaded_after_the_attach_is_placed_by_the_kernels_record(tmp_path,
                                                                           monkeypatch, flood):
    """The worker loads a library after the harness attached and exits right after running it:
    with no read of ``/proc`` at all (a starved polling thread), the kernel's mmap record in the
    thread's mappings ring still places the samples in that library. Samples flooded: a sample
    ring of one page drained every 0.3 s loses most samples, and no mapping record (its ring is
    another). Mappings flooded (thousands of executable pages mapped right before the library,
    a mappings ring of one page): the library's record is lost, its samples are in no mapping
    seen, and they still count as the candidate's code (:func:`observer.between_calls`)."""
    if flood:
        monkeypatch.setattr(observer, "RING_PAGES" if flood == "samples" else "MAP_RING_PAGES",
                            1)
        monkeypatch.setattr(observer, "POLL_S", 0.3)
    src, lib = tmp_path / "late.c", tmp_path / "liblate.so"
    src.write_text(LATE_LIBRARY)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.setattr(observer, "executable_maps", lambda pid: [])
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LATE_CHILD), str(lib),
                              "3000" if flood == "mappings" else "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sampler = observer.CpuSampler()
    sampler.attach(child.pid)
    deadline = time.monotonic() + 60
    while not sampler.out.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    out, _ = child.communicate("go\n", timeout=120)
    sampled = sampler.stop()
    start, end = (int(x) for x in out.split())
    placed = Counter(sampled.where(pid, ip) for t, ip, pid in
                     zip(sampled.times, sampled.ips, sampled.pids) if start <= t <= end)
    if flood == "mappings":
        assert sampled.lost_maps > 1000 and placed["?"] > 0.8 * sum(placed.values()) > 100, \
            (placed, sampled.lost_maps)
        within, between = observer.between_calls(sampled, [(start, end)])
        assert within >= placed["?"] and not between, (within, between)
        return
    assert placed[os.path.realpath(lib)] > 0.8 * sum(placed.values()) > (20 if flood else 100), \
        (placed, sampled.lost)
    assert sampled.lost_maps == 0 and (sampled.lost > 1000 if flood else True), \
        (sampled.lost, sampled.lost_maps)
