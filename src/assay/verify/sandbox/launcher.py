"""The launcher (``python -m assay.verify.sandbox --launch SPEC -- CMD...``): runs as the
parent's user (root, usually), sets the sandbox up as the spec says, reports what it applied
through a pipe it closes first, and execs the worker. A zygote's child (``--zygote``,
:mod:`assay.verify.sandbox.zygote`) runs the same set-up and then the worker in its own
process, torch already imported."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from assay.verify.sandbox.libc import check, get_libc
from assay.verify.sandbox.mounts import (MS_NODEV, MS_NOEXEC, MS_NOSUID, HalfMounted, mount,
                                         setup_mounts)

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _drop_capabilities() -> None:
    """Root without capabilities: it cannot remount, mount, setns, load modules or trace."""
    libc = get_libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    check(libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


def launch(spec: dict, cmd: list[str],
           in_process: Callable[[list[str]], int] | None = None) -> None:
    """Set the sandbox up, then exec ``cmd`` (or, from a zygote, ``in_process(cmd)`` in this
    process under the spec's environment); never returns."""
    libc = get_libc()
    report_fd = spec["report_fd"]
    os.set_inheritable(report_fd, False)
    rep: dict[str, str] = {}

    def send(**items: str) -> None:
        os.write(report_fd, (json.dumps(items) + "\n").encode())

    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the harness
    if os.getppid() != spec.get("parent", os.getppid()):
        os._exit(111)  # the harness is gone already
    root = os.geteuid() == 0
    for procs in spec["cgroup_procs"]:  # before anything forks: the whole tree is counted
        try:
            Path(procs).write_text(str(os.getpid()))
        except OSError:
            pass

    if not spec["net"]:
        try:
            check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            rep["network"] = "on: own network namespace, loopback down"
        except OSError as e:
            rep["network"] = f"off: {e.strerror}"
    else:
        rep["network"] = f"off: {spec['net']}"

    mounted = False
    if spec["mount"] is None:
        rep["filesystem"] = "off: disabled by ASSAY_SANDBOX_DISABLE"
    else:
        try:
            check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            try:
                how = setup_mounts(spec["mount"])
                mounted = True
                also = " and the kernel cache" if len(spec["mount"]["rw"]) > 1 else ""
                rep["filesystem"] = f"on: read-only except the scratch folder{also} ({how})"
            except HalfMounted as e:
                send(launcher_error=f"mount namespace: {e.strerror}", **rep)
                os._exit(126)
            except OSError as e:
                rep["filesystem"] = f"off: {e.strerror}"
        except OSError as e:
            rep["filesystem"] = f"off: {e.strerror}"

    uid, gid = spec["uid"], spec["gid"]
    if uid is not None and spec["uid_needs_covers"] and not mounted:
        uid = gid = None
        spec["uid_plan_error"] = ("its interpreter is under a folder only root may enter and "
                                  "there is no mount namespace to show it")

    pidns = False
    if spec["pidns"]:
        try:
            check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            pidns = True
        except OSError as e:
            rep["pid_namespace"] = f"off: {e.strerror}"
    else:
        rep["pid_namespace"] = "off: disabled by ASSAY_SANDBOX_DISABLE"
    if pidns:
        pid = os.fork()
        if pid:  # the relay: waits, then ends the way the worker ended
            os.close(report_fd)
            try:  # the cgroup's OOM killer is for the worker, not for this relay
                Path("/proc/self/oom_score_adj").write_text("-1000")
            except OSError:
                pass
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_IGN)
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    os._exit(112)
                except InterruptedError:
                    continue
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                os.kill(os.getpid(), sig)
                os._exit(128 + sig)
            os._exit(os.WEXITSTATUS(status))
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        rep["pid_namespace"] = "on: the worker is process 1 of its own pid namespace"
        if mounted:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                rep["pid_namespace"] += " (sees only its own processes)"
            except OSError:
                pass

    try:
        if uid is not None:
            _chown_tree(spec["cwd"], uid, gid)
        for name, value in spec["rlimits"]:
            lim = getattr(resource, name)
            soft, hard = resource.getrlimit(lim)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(lim, (value, value))
        if uid is not None:
            os.setgroups(spec.get("groups", []))
            os.setgid(gid)
            os.setuid(uid)
            rep["user"] = f"on: unprivileged uid {uid}"
        elif root and spec["drop_caps"]:
            _drop_capabilities()
            rep["user"] = f"off: root with every capability dropped ({spec['uid_plan_error']})"
        else:
            rep["user"] = f"off: {spec['uid_plan_error'] or 'runs as the calling user'}"
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a uid change cleared it
        if uid is not None and not pidns:
            try:
                os.kill(-1, signal.SIGKILL)  # what an earlier run of this uid left behind
            except ProcessLookupError:
                pass
        os.chdir(spec["cwd"])
    except OSError as e:
        send(launcher_error=f"{e}", **rep)
        os._exit(126)
    send(**rep)
    os.close(report_fd)
    if in_process is not None:
        # What an exec would have reset: the uid change left the process undumpable, so its
        # own /proc/self (maps, which the worker reads for provenance; environ) was root's.
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.environ.clear()
        os.environ.update(spec["env"])
        os._exit(in_process(cmd))
    try:
        os.execvpe(cmd[0], cmd, spec["env"])
    except OSError as e:
        os.write(2, f"sandbox: cannot run {cmd[0]}: {e}\n".encode())
        os._exit(127)


def _chown_tree(top: str, uid: int, gid: int) -> None:
    os.chown(top, uid, gid)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "--launch" and argv[2] == "--":
        launch(json.loads(argv[1]), argv[3:])
        return 0  # not reached: launch execs or exits
    if len(argv) == 2 and argv[0] == "--zygote":
        from assay.verify.sandbox.zygote import serve

        return serve(int(argv[1]))
    print("usage: python -m assay.verify.sandbox --launch SPEC -- CMD... | --zygote FD",
          file=sys.stderr)
    return 2
