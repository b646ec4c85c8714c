"""pids and memory cgroups (v1 or v2) for one sandboxed run, where this machine lets us make
them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from assay.verify.sandbox.host import is_root
from assay.verify.sandbox.mounts import unescape
from assay.verify.settings import SandboxLimits


class Cgroups:
    """pids and memory cgroups (v1 or v2) for one run, where this machine lets us make them."""

    def __init__(self):
        self.dirs: list[Path] = []
        self.pids = False
        self.memory = False
        self.why = ""
        self._oom_before = 0

    @classmethod
    def create(cls, index: int | None, limits: SandboxLimits,
               disabled: set[str]) -> "Cgroups":
        self = cls()
        if "cgroup" in disabled:
            self.why = "cgroups disabled by ASSAY_SANDBOX_DISABLE"
            return self
        if not is_root():
            self.why = "not root"
            return self
        name = f"assay-sandbox-{index if index is not None else os.getpid()}"
        try:
            places = _cgroup_places()
        except OSError as e:
            self.why = f"cannot read /proc/self/cgroup: {e}"
            return self
        errors = []
        for ctrl, (base, version) in places.items():
            d = base / name
            try:
                if d.exists():
                    _cgroup_kill(d)
                    d.rmdir()
                d.mkdir()
            except OSError as e:
                errors.append(f"{ctrl}: {e.strerror or e}")
                continue
            try:
                if ctrl == "pids":
                    (d / "pids.max").write_text(str(int(limits.processes)))
                    self.pids = True
                elif ctrl == "memory" and limits.memory_gb:
                    n = str(int(limits.memory_gb * (1 << 30)))
                    (d / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(n)
                    if version == 2 and (d / "memory.swap.max").exists():
                        (d / "memory.swap.max").write_text("0")
                    self.memory = True
                if d not in self.dirs:
                    self.dirs.append(d)
            except OSError as e:
                errors.append(f"{ctrl}: {e.strerror or e}")
                try:
                    d.rmdir()
                except OSError:
                    pass
        if not places:
            self.why = "no writable pids or memory cgroup here"
        elif errors:
            self.why = "; ".join(errors)
        self._oom_before = self._oom_count()
        return self

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _oom_count(self) -> int:
        n = 0
        for d in self.dirs:
            for fname in ("memory.events", "memory.oom_control"):
                try:
                    for line in (d / fname).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == "oom_kill":
                            n += int(v)
                except (OSError, ValueError):
                    pass
        return n

    def oom_killed(self) -> bool:
        return self._oom_count() > self._oom_before

    def kill_all(self) -> None:
        for d in self.dirs:
            _cgroup_kill(d)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _cgroup_kill(d)
                    time.sleep(0.02)
        self.dirs = []


def _cgroup_kill(d: Path) -> None:
    kill = d / "cgroup.kill"
    if kill.exists():
        try:
            kill.write_text("1")
        except OSError:
            pass
    for _ in range(200):
        try:
            pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _cgroup_places() -> dict[str, tuple[Path, int]]:
    """{"pids"|"memory": (this process's cgroup folder in that hierarchy, version)} for the
    hierarchies that are mounted and writable here."""
    mounts: list[tuple[Path, str, set[str]]] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                mounts.append((Path(unescape(fields[4])), rfields[0],
                               set(rfields[2].split(","))))
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else ["" if hid == "0" else ctrls]:
                own[c] = path
    out: dict[str, tuple[Path, int]] = {}
    for ctrl in ("pids", "memory"):
        for mnt, fstype, opts in mounts:
            if fstype == "cgroup" and ctrl in opts and ctrl in own:
                base = mnt / own[ctrl].lstrip("/")
                if os.access(base, os.W_OK):
                    out[ctrl] = (base, 1)
                break
        else:
            for mnt, fstype, _ in mounts:
                if fstype == "cgroup2" and "" in own:
                    base = mnt / own[""].lstrip("/")
                    try:
                        avail = (base / "cgroup.subtree_control").read_text().split()
                    except OSError:
                        continue
                    if ctrl in avail and os.access(base, os.W_OK):
                        out[ctrl] = (base, 2)
                        break
    return out
