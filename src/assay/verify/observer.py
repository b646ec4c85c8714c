"""An observer outside the worker (issue #19, KernelGuard's forged result objects).

On the cpu target the candidate runs inside the process that writes the verifier's report: the
kernel audit's rows (which ATen ops each timed call ran) come from a profiler in that process,
and a candidate can rewrite them on their way out (``tests/zoo/candidates/
exploit_forged_worker_report.py``: torch.softmax under the strict policy, reported as a kernel
of its own). This module looks from the harness's process instead. Every thread of the worker
is sampled with ``perf_event_open`` (a software cpu-clock event per thread: the instruction
pointer in user space and a CLOCK_MONOTONIC time, every ``PERIOD_NS`` of the thread's CPU
time), and each sample is placed in the file whose code it was in: the worker's
``/proc/<pid>/maps``, read by the harness when it attaches a thread, and the mappings the kernel
records as the attached threads make them (``PERF_RECORD_MMAP``, from a second, non-sampling
event per thread with a ring of its own, which no flood of samples can overflow), so a library
loaded just before the worker exits is placed however late the harness reads. The kernel writes
the samples and the records; nothing the candidate does in its process reaches them.

The check (:func:`disagreement`): within the windows of the timed calls, the share of their wall
time the samples place in torch's own libraries (``libtorch_cpu``, ``libtorch``, ``libc10``:
ATen's kernels and its dispatch; :func:`torch_wall_share`) may not exceed the share of a call's
span the report gives to ATen ops (the calls' upper quartile, :func:`upper_quartile`) by more
than ``MARGIN``. An honest report says where ATen ran (copies and allocations included, since
they are ATen too); a rewritten one that hides library compute is contradicted. Limits, said in
the README: the windows are the worker's (a candidate that also moves them, or that does its
library work in threads that live under one polling interval, is not caught by this alone);
with too few samples in the windows (tiny calls, few of them) the check says so and passes;
where ``perf_event_open`` is refused (not root and another uid, ``perf_event_paranoid``) the
observer is off and the verdict says why.
"""

from __future__ import annotations

import array
import bisect
import ctypes
import errno
import math
import mmap
import os
import re
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# One sample per 100 us of a thread's CPU time (~1-2% of it in the sampling interrupt)
PERIOD_NS = 100_000
# Samples within the timed calls' windows below which the check cannot tell (it passes, says so)
MIN_SAMPLES = 50
# How far the sampled share of torch's libraries may exceed the report's ATen share of the calls
# (the profiler's own callbacks and ATen's dispatch run in libtorch_cpu too, counted by neither
# report row)
MARGIN = 0.35
POLL_S = 0.05            # new threads attached, ring buffers drained
MAPS_EVERY_S = 0.2       # each process's mappings read again
RING_PAGES = 128         # per thread: 512 KiB, ~16000 samples between drains
MAP_RING_PAGES = 32      # per thread: 128 KiB, ~1000 mmap records between drains

_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_CPU_CLOCK, _PERF_COUNT_SW_DUMMY = 1, 0, 9
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME = 1, 2, 4
_EXCLUDE_KERNEL, _EXCLUDE_HV, _MMAP, _USE_CLOCKID = 1 << 5, 1 << 6, 1 << 8, 1 << 25
_CLOCK_MONOTONIC = 1
_PERF_FLAG_FD_CLOEXEC = 8
_RECORD_MMAP, _RECORD_LOST, _RECORD_SAMPLE = 1, 2, 9
# torch's own code: ATen's kernels (MKL and oneDNN are linked into libtorch_cpu) and dispatch
TORCH_LIBRARY = re.compile(r"/lib(torch_cpu|torch|c10)\.so[^/]*$")
# OpenMP runtimes: an idle team's threads spin in them, whoever's team it is (not counted)
OPENMP_RUNTIME = re.compile(r"/lib(g|i)omp[^/]*\.so[^/]*$")


class _Attr(ctypes.Structure):
    """``struct perf_event_attr`` (PERF_ATTR_SIZE_VER5, 112 bytes)."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64),
                ("config2", ctypes.c_uint64), ("branch_sample_type", ctypes.c_uint64),
                ("sample_regs_user", ctypes.c_uint64), ("sample_stack_user", ctypes.c_uint32),
                ("clockid", ctypes.c_int32), ("sample_regs_intr", ctypes.c_uint64),
                ("aux_watermark", ctypes.c_uint32), ("sample_max_stack", ctypes.c_uint16),
                ("reserved_2", ctypes.c_uint16)]


def _open_event(tid: int, sampling: bool = True) -> int:
    """An event on thread ``tid`` (any CPU): the sampling one, or (``sampling`` False) one that
    only records the executable mappings the thread makes (a dummy software event with
    ``attr.mmap``, as perf's tracking event); raises OSError with the kernel's reason."""
    nr = _SYS_PERF_EVENT_OPEN.get(os.uname().machine)
    if nr is None:
        raise OSError(f"perf_event_open: unknown syscall number on {os.uname().machine}")
    if sampling:
        attr = _Attr(type=_PERF_TYPE_SOFTWARE, size=ctypes.sizeof(_Attr),
                     config=_PERF_COUNT_SW_CPU_CLOCK, sample_period=PERIOD_NS,
                     sample_type=_SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME,
                     flags=_EXCLUDE_KERNEL | _EXCLUDE_HV | _USE_CLOCKID,
                     clockid=_CLOCK_MONOTONIC)
    else:
        attr = _Attr(type=_PERF_TYPE_SOFTWARE, size=ctypes.sizeof(_Attr),
                     config=_PERF_COUNT_SW_DUMMY, flags=_EXCLUDE_KERNEL | _EXCLUDE_HV | _MMAP)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, ctypes.byref(attr), tid, -1, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


class _Ring:
    """One of a thread's events and its ring buffer of records: the samples, or (``sampling``
    False) the mappings. Apart, a candidate that floods its samples (a starved harness drains
    late) makes the kernel drop samples only: every mapping is still known, and so is code in
    none (:func:`between_calls`)."""

    def __init__(self, tid: int, sampling: bool = True):
        self.fd = _open_event(tid, sampling)
        self.sampling = sampling
        page, pages = mmap.PAGESIZE, RING_PAGES if sampling else MAP_RING_PAGES
        try:
            self.buf = mmap.mmap(self.fd, page * (1 + pages), mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(self.fd)
            raise
        self.data = page
        self.size = page * pages
        self.tail = 0

    def drain(self, out: "Sampled") -> None:
        head = struct.unpack_from("<Q", self.buf, 1024)[0]
        while self.tail < head:
            at = self.tail % self.size
            header = self._bytes(at, 8)
            kind, _misc, size = struct.unpack("<IHH", header)
            if size < 8:
                break  # (never written so by the kernel: stop rather than spin)
            if kind == _RECORD_SAMPLE and size >= 32:
                ip, pid, _tid, t = struct.unpack("<QIIQ", self._bytes(at + 8, 24))
                out.add(t, ip, pid)
            elif kind == _RECORD_MMAP and size > 40:
                # (pid, tid, addr, len, pgoff, the file's name NUL-padded to 8 bytes)
                pid, _tid, addr, length, _pgoff = struct.unpack("<IIQQQ", self._bytes(at + 8, 32))
                name = self._bytes(at + 40, size - 40).split(b"\0", 1)[0]
                path = name.decode(errors="replace")
                out.merge_maps(pid, [(addr, addr + length, "" if path == "//anon" else path)])
            elif kind == _RECORD_LOST and size >= 24:
                lost = struct.unpack("<QQ", self._bytes(at + 8, 16))[1]
                if self.sampling:
                    out.lost += lost
                else:
                    out.lost_maps += lost
            self.tail += size
        struct.pack_into("<Q", self.buf, 1032, self.tail)  # data_tail: the kernel may reuse

    def _bytes(self, at: int, n: int) -> bytes:
        at %= self.size
        first = self.buf[self.data + at:self.data + min(at + n, self.size)]
        return first + self.buf[self.data:self.data + n - len(first)]

    def close(self) -> None:
        self.buf.close()
        os.close(self.fd)


@dataclass
class Sampled:
    """What the observer saw: per sample its time (CLOCK_MONOTONIC ns), instruction pointer
    and process; each sampled process's executable mappings (start, end, path), sorted; the
    threads attached, the samples and the mapping records the kernel dropped, and why there is
    nothing (off)."""

    times: array.array = field(default_factory=lambda: array.array("Q"))
    ips: array.array = field(default_factory=lambda: array.array("Q"))
    pids: array.array = field(default_factory=lambda: array.array("L"))
    maps: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    threads: int = 0
    lost: int = 0
    lost_maps: int = 0
    why_off: str = ""

    def add(self, t: int, ip: int, pid: int) -> None:
        self.times.append(t)
        self.ips.append(ip)
        self.pids.append(pid)

    def merge_maps(self, pid: int, spans: list[tuple[int, int, str]]) -> None:
        """``pid``'s executable mappings ``spans`` (disjoint), over those known before: an
        earlier span that overlaps none of them is kept (a library since unmapped, a process
        gone), one they overlap is replaced (an exec, an address reused)."""
        if spans:
            spans = sorted(spans)
            starts = [lo for lo, _, _ in spans]

            def overlaps(lo: int, hi: int) -> bool:
                i = bisect.bisect_left(starts, hi) - 1  # the last new span starting below hi
                return i >= 0 and spans[i][1] > lo

            kept = [old for old in self.maps.get(pid, []) if not overlaps(old[0], old[1])]
            self.maps[pid] = sorted(spans + kept)

    def where(self, pid: int, ip: int) -> str:
        """The file the code at ``ip`` of ``pid`` came from ("" for anonymous memory, "?" for
        an address outside every mapping the observer read)."""
        spans = self.maps.get(pid, [])
        i = bisect.bisect_right(spans, (ip, float("inf"), "")) - 1
        if i >= 0 and spans[i][0] <= ip < spans[i][1]:
            return spans[i][2]
        return "?"


def _thread_rings(tid: int) -> list[_Ring]:
    """Thread ``tid``'s two events: its mappings' first, so that a mapping made before its
    samples are taken is recorded (or in ``/proc``, read right after the attach)."""
    maps = _Ring(tid, sampling=False)
    try:
        return [maps, _Ring(tid)]
    except OSError:
        maps.close()
        raise


def executable_maps(pid: int) -> list[tuple[int, int, str]]:
    """The executable mappings of ``pid`` (start, end, path), sorted; [] once it is gone."""
    spans = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) < 2 or "x" not in parts[1]:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                spans.append((lo, hi, parts[5].strip() if len(parts) > 5 else ""))
    except OSError:
        return []
    return sorted(spans)


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it (``/proc/<pid>/task/<tid>/children``)."""
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return seen


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class CpuSampler:
    """Samples every thread of a process tree from outside it, from :meth:`attach` (the root's
    pid: the sandbox's launcher or the zygote's child) to :meth:`stop`. A polling thread
    attaches to threads as they appear and drains the rings; :meth:`stop` returns
    :class:`Sampled` (``why_off`` set where the kernel refused)."""

    def __init__(self):
        self.out = Sampled()
        self._rings: dict[int, list[_Ring]] = {}  # per thread: its mappings', its samples
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._root = 0

    def attach(self, root_pid: int) -> None:
        self._root = root_pid
        self._thread = threading.Thread(target=self._loop, name="assay-observer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        maps_at: dict[int, float] = {}
        while True:
            stopping = self._stop.is_set()
            for pid in _descendants(self._root):
                attached = False
                for tid in _threads(pid):
                    if tid in self._rings or self.out.why_off:
                        continue
                    try:
                        self._rings[tid] = _thread_rings(tid)
                        self.out.threads += 1
                        attached = True
                    except OSError as e:
                        # ESRCH: the thread is gone or exiting (its /proc entry can outlive
                        # the exit by a moment), never a refusal
                        if e.errno == errno.ESRCH or not os.path.exists(f"/proc/{pid}/task/{tid}"):
                            continue  # (the thread ended meanwhile)
                        self.out.why_off = str(e.strerror or e)
                # A thread's code mapped before its event opened is in /proc now (read after
                # the attach); what any attached thread maps later, the kernel records in its
                # ring (PERF_RECORD_MMAP), so a library loaded just before the worker exits is
                # placed however late this thread runs
                now = time.monotonic()
                if attached or now - maps_at.get(pid, 0.0) >= MAPS_EVERY_S or stopping:
                    self._read_maps(pid)
                    maps_at[pid] = now
            mark = len(self.out.times)
            for rings in self._rings.values():
                for ring in rings:
                    ring.drain(self.out)
            # A sample in no mapping read yet (an exec, a library just loaded): read its
            # process's mappings now, while the code is most likely still mapped
            for pid in {pid for ip, pid in zip(self.out.ips[mark:], self.out.pids[mark:])
                        if self.out.where(pid, ip) == "?"}:
                self._read_maps(pid)
            if stopping or self.out.why_off:
                return
            self._stop.wait(POLL_S)

    def _read_maps(self, pid: int) -> None:
        """``pid``'s executable mappings as ``/proc`` has them now (:meth:`Sampled.merge_maps`)."""
        self.out.merge_maps(pid, executable_maps(pid))

    def stop(self) -> Sampled:
        """The samples so far, the rings drained once more (their mmap records with them). The
        harness calls this after the worker has ended, so the maps read then find nothing new:
        a library is placed by its mmap record where an attached thread mapped it, else by a
        read of ``/proc`` while the worker lived. Only a thread that mapped code and ended
        between two polls, in a worker gone before the next read, leaves its samples unplaced
        (:func:`between_calls` counts those as the candidate's where no record was lost)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for rings in self._rings.values():
            for ring in rings:
                ring.close()
        self._rings.clear()
        if self._thread is None and not self.out.why_off:
            self.out.why_off = "never attached"
        return self.out


def available() -> str:
    """"" where this process may sample another's threads, else why not (the kernel's
    answer for this process itself, the least it could be refused)."""
    try:
        for ring in _thread_rings(threading.get_native_id()):
            ring.close()
    except OSError as e:
        return str(e.strerror or e)
    return ""


def _kinds_in(sampled: Sampled, windows: list[tuple[int, int]]):
    """(time, kind) of each sample within ``windows`` (CLOCK_MONOTONIC ns, [start, end]), its
    kind where its code was: ``torch`` (TORCH_LIBRARY), ``openmp`` (OPENMP_RUNTIME),
    ``unplaced`` (an address in no executable mapping the observer read: a process gone before
    its maps were), ``other`` (the candidate's libraries, Python, libc, numpy, anonymous JIT
    code)."""
    spans = sorted(windows)
    starts = [a for a, _ in spans]
    for t, ip, pid in zip(sampled.times, sampled.ips, sampled.pids):
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > spans[i][1]:
            continue
        path = sampled.where(pid, ip)
        yield t, ("torch" if TORCH_LIBRARY.search(path) else "openmp"
                  if OPENMP_RUNTIME.search(path) else "unplaced" if path == "?" else "other")


def shares(sampled: Sampled, windows: list[tuple[int, int]]) -> dict[str, int]:
    """Samples within ``windows`` by kind (:func:`_kinds_in`)."""
    counts = {"torch": 0, "openmp": 0, "unplaced": 0, "other": 0}
    for _, kind in _kinds_in(sampled, windows):
        counts[kind] += 1
    return counts


def torch_wall_share(sampled: Sampled, windows: list[tuple[int, int]],
                     bucket_ns: int = PERIOD_NS) -> float | None:
    """The share of the windows' wall time the sampled threads spent in torch's libraries
    rather than in other code (OpenMP's runtime and unplaced addresses left out), as the
    report's ATen share is one of each call's span. Samples are per thread's CPU time, so four
    threads in a BLAS call give four samples where one thread in the candidate's code gives
    one; here each ``bucket_ns`` of wall time counts once, shared among the kinds of the
    samples that fell in it. None where no sample counts."""
    buckets: dict[int, list[int]] = {}
    for t, kind in _kinds_in(sampled, windows):
        if kind in ("torch", "other"):
            buckets.setdefault(t // bucket_ns, [0, 0])[kind == "other"] += 1
    if not buckets:
        return None
    return sum(torch / (torch + other) for torch, other in buckets.values()) / len(buckets)


def code_roots(own_dirs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(trusted, own) folder prefixes. Trusted: code that is not the candidate's, the
    interpreter's trees, every folder on this process's import path (torch, numpy, the project)
    and the system's libraries, which the sandbox mounts read-only; a folder holding one of
    ``own_dirs`` is left out. Own: ``own_dirs`` (the candidate's build cache and scratch
    folder), the candidate's wherever else they lie."""
    own = tuple(sorted({os.path.realpath(d).rstrip("/") + "/" for d in own_dirs if d}))
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(p for p in sys.path if p and os.path.isdir(p)),
             "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin"}
    trusted = {os.path.realpath(r).rstrip("/") + "/" for r in roots}
    return tuple(sorted(r for r in trusted if not any(o.startswith(r) for o in own))), own


def own_code(path: str, roots: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether a sample's file (:meth:`Sampled.where`) is code the candidate brought: a file in
    its own folders or outside the trusted ones (:func:`code_roots`). Anonymous memory ("": JIT
    code, oneDNN's among it), pseudo-files ("[vdso]") and addresses in no mapping the observer
    saw ("?") are not (:func:`between_calls` says when the last are)."""
    trusted, own = roots
    if own and path.startswith(own):
        return True
    return path.startswith("/") and not path.startswith(trusted) and \
        not TORCH_LIBRARY.search(path) and not OPENMP_RUNTIME.search(path)


def between_calls(sampled: Sampled, windows: list[tuple[int, int]],
                  own_dirs: tuple[str, ...] = ()) -> tuple[int, Counter[str]]:
    """(within, between): samples of the candidate's own code (:func:`own_code`) within the
    consecutive ``windows`` (the timed calls', in call order), and those in the gaps between
    them by file. Its code runs inside its calls; in a gap it is work moved out of the timed
    calls (a window or a clock forged shorter) or a thread of the candidate's working between
    calls.

    An address in no mapping the observer saw ("?") counts as the candidate's: every mapping an
    attached thread makes is in its mappings' ring (PERF_RECORD_MMAP) and each thread's earlier
    ones are read from ``/proc`` at its attach, while the trusted libraries are mapped when the
    worker starts; so such code was mapped by a thread that ended between two polls (a library
    loaded to be hidden). Mapping records lost change nothing: the ring holds ~1000 of them
    between two drains and an honest worker makes a few executable mappings, so a loss is the
    candidate's own flood (its hidden library may be among the records dropped). Lost samples
    do not matter either: their ring is another."""
    spans = sorted(windows)
    between: Counter[str] = Counter()
    if not spans:
        return 0, between
    starts = [a for a, _ in spans]
    first, last = spans[0][0], spans[-1][1]
    roots = code_roots(own_dirs)
    within = 0
    for t, ip, pid in zip(sampled.times, sampled.ips, sampled.pids):
        if not first <= t <= last:
            continue
        path = sampled.where(pid, ip)
        if not (own_code(path, roots) or path == "?"):
            continue
        i = bisect.bisect_right(starts, t) - 1
        if t <= spans[i][1]:
            within += 1
        else:
            between[path] += 1
    return within, between


def reported_aten_share(call: dict[str, Any]) -> float:
    """The share of one timed call's window its report gives to ATen ops' host time (copies
    and allocations included; at most 1)."""
    start, end = call["window_ns"]
    span_us = (end - start) / 1e3
    aten = sum(float(r.get("cpu_us") or 0.0) for r in call.get("rows", [])
               if str(r.get("name", "")).startswith("aten::"))
    return min(1.0, aten / span_us) if span_us > 0 else 0.0


def upper_quartile(values: list[float]) -> float:
    """The calls' upper quartile. A call's reported share is of its wall time, so a preemption
    in the candidate's Python between ATen ops lowers it while the samples (of CPU time) do not
    move: on a loaded machine most calls lose some of their share and a median drifts down
    (an honest library GEMM with a custom epilogue: 0.49 median, 0.58-0.61 upper quartile
    against 0.79-0.83 sampled, beside two busy processes on two cores). A report that hides
    library work hides it in every call (audit_consistency compares the calls' ops)."""
    ordered = sorted(values)
    return ordered[(3 * len(ordered)) // 4] if ordered else 0.0


def disagreement(sampled: Sampled, calls: list[dict[str, Any]]) -> tuple[bool, str]:
    """(ok, detail) of the observer against the report's timed calls (``audit.calls``: each
    with its ``window_ns`` and ``rows``)."""
    if sampled.why_off:
        return True, f"out-of-process observer off: {sampled.why_off}"
    windows = [tuple(c["window_ns"]) for c in calls if isinstance(c.get("window_ns"), list)
               and len(c["window_ns"]) == 2]
    if calls and len(windows) != len(calls):
        return False, ("the report's timed calls carry no time windows, though the worker "
                       "writes one per call: the report was rewritten")
    counts = shares(sampled, windows)
    counted = counts["torch"] + counts["other"]
    seen = (f"{counted} samples of {sampled.threads} thread(s) in the {len(windows)} timed "
            f"calls ({counts['openmp']} more in OpenMP's runtime, {counts['unplaced']} in no "
            f"mapping read, {sampled.lost} samples and {sampled.lost_maps} mapping records lost "
            f"by the kernel)")
    if counted < MIN_SAMPLES:
        return True, f"out-of-process observer: {seen}, too few to compare"
    sampled_share = torch_wall_share(sampled, windows)
    reported = upper_quartile([reported_aten_share(c) for c in calls])
    detail = (f"out-of-process observer: {seen}: {sampled_share:.0%} of their wall time in "
              f"torch's libraries; the worker's report gives ATen ops {reported:.0%} of a call "
              f"(upper quartile)")
    if sampled_share > reported + MARGIN:
        return False, detail + ": the report hides library work (it was rewritten)"
    return True, detail


# A timed call's time (the timing loop's clock around the call) against its window (the audit's
# clock inside it): the window is measured inside the call's time, both on CLOCK_MONOTONIC
SLACK_MS = 0.001
# Samples of the candidate's code between timed calls from which work moved out of the calls
# is said: at least this many, and this share of all its samples in the timed stretch
BETWEEN_MIN = 5
BETWEEN_SHARE = 0.1


def _windows_of(calls: list[dict[str, Any]]) -> list[tuple[int, int]] | None:
    """The timed calls' windows, in call order, or None where one is missing or malformed."""
    out = []
    for c in calls:
        w = c.get("window_ns")
        if not (isinstance(w, list) and len(w) == 2 and all(isinstance(x, int) for x in w)):
            return None
        out.append((w[0], w[1]))
    return out


def timing_disagreement(reported: dict[str, Any], calls: list[dict[str, Any]],
                        sampled: Sampled, own_dirs: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(ok, detail) of a cpu report's timing against its own windows and the observer.

    Three links, each one the worker cannot forge without breaking the next: the reported
    timing is the one its per-call times give (``timing.cpu_timing``, recomputed here); each
    timed call's time holds its window (the audit's clock inside the call); and the
    candidate's own code runs inside those windows, as the harness's own samples see it
    (:func:`between_calls`). A report that shortens the times, the windows and all is caught
    by the last where the candidate's work is code of its own; work done in torch's or
    another trusted library between calls is not told apart from the worker's own (flushes,
    input swaps) and is not caught by this alone."""
    from assay.bench.timing import cpu_timing

    windows = _windows_of(calls)
    sizes, per_call = reported.get("round_sizes"), reported.get("calls_ms")
    if windows is None or not isinstance(sizes, list) or not isinstance(per_call, list) \
            or not all(isinstance(n, int) and n > 0 for n in sizes) \
            or not all(isinstance(x, (int, float)) for x in per_call) \
            or sum(sizes) != len(per_call) or len(per_call) != len(windows) or not per_call:
        return False, ("the report's timing carries no per-call times matching its timed calls' "
                       "windows, though the worker writes both: the report was rewritten")
    problems = []
    rounds, at = [], 0
    for n in sizes:
        rounds.append(per_call[at:at + n])
        at += n
    again = cpu_timing(rounds)
    said = (reported.get("median_ms"), reported.get("iqr_ms"))
    if not all(isinstance(x, (int, float)) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
               for x, y in zip(said, (again.median_ms, again.iqr_ms))):
        problems.append(f"the reported median {said[0]} ms is not the {again.median_ms:.4g} ms "
                        f"its own per-call times give: the report was rewritten")
    if any(b < a or (i and a < windows[i - 1][1]) for i, (a, b) in enumerate(windows)):
        problems.append("the timed calls' windows overlap or run backwards: the report was "
                        "rewritten")
    spans_ms = [(b - a) / 1e6 for a, b in windows]
    short = [i for i, (ms, span) in enumerate(zip(per_call, spans_ms)) if ms < span - SLACK_MS]
    if short:
        i = short[len(short) // 2]
        problems.append(f"{len(short)} of {len(per_call)} timed calls are reported shorter than "
                        f"their own call windows (e.g. {per_call[i]:.4g} ms for a "
                        f"{spans_ms[i]:.4g} ms window): the times were rewritten")
    if sampled.why_off:
        seen = f"out-of-process observer off: {sampled.why_off}"
    else:
        within, by_file = between_calls(sampled, windows, own_dirs)
        between = sum(by_file.values())
        seen = (f"{within} samples of the candidate's own code in its {len(windows)} timed "
                f"calls, {between} between them")
        if between >= BETWEEN_MIN and between > BETWEEN_SHARE * (within + between):
            files = ", ".join(f"{n} in {'no mapping seen' if p == '?' else os.path.basename(p)}"
                              for p, n in by_file.most_common(3))
            flood = (f"; {sampled.lost_maps} mapping records lost: a flood of executable "
                     f"mappings" if sampled.lost_maps and "?" in by_file else "")
            problems.append(seen + f" ({files}{flood}): its work ran outside the windows timed "
                            "(a window or clock forged shorter, or a thread working between "
                            "calls)")
    return not problems, "; ".join(problems) or f"per-call times agree with the windows; {seen}"
