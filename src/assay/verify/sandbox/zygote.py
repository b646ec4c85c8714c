"""A launcher with torch already imported (issue #16: the worker started before the candidate
is known). Importing torch is most of a small verification's cost (1.5 s of the 2.7 s a cpu
candidate took on the 2-core CI machine; 4-5 s on the GPU machine); the worker's own code,
the candidate and every sandbox layer are as before.

The harness starts one zygote per process (``python -m assay.verify.sandbox --zygote FD``),
with the candidate's environment (:func:`assay.verify.sandbox.parent.candidate_env`: no API
key is ever in its memory or in its ``/proc/self/environ``). It imports torch and waits, single
threaded apart from BLAS's idle pool, never touching CUDA. For each worker the harness sends
the launcher's spec and three descriptors (the worker's log, the launcher's report pipe, a
status socket) over a socket only it holds; the zygote forks, and the child does what the exec
path's launcher does (:func:`assay.verify.sandbox.launcher.launch`: cgroups, namespaces,
read-only mounts, uid, limits), then runs the worker in that process instead of exec'ing a
fresh Python. Before that it closes every descriptor but the log and the report pipe (the
control socket above all: a candidate that held it could ask for a fork with a spec of its
own), and takes the candidate's environment in full.

The zygote reaps its children and sends each one's wait status and CPU time on its status
socket; the harness waits on that socket as on a process (:class:`Child`), and kills the
child's process group (the child starts its own session) exactly as it kills the exec path's
launcher. When the harness's end of the control socket closes (the harness exited or was
killed), the zygote kills its children and exits. The default on every device
(``ASSAY_SANDBOX_ZYGOTE=0`` turns it off; :func:`wanted`); a zygote that cannot start or stops
answering is left for the exec path, with a log line."""

from __future__ import annotations

import importlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from assay import messages

log = logging.getLogger("assay.sandbox")

WORKER = ("-m", "assay.verify.worker")  # the one command the zygote runs (after sys.executable)
# What a process reads from its environment when torch loads, not later (libgomp's thread count,
# MKL's, OpenBLAS's; the import path): a zygote serves only workers whose values are its own.
AT_IMPORT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONPATH",
             "LD_LIBRARY_PATH", "PATH")
_MAX_MSG = 1 << 20
_FDS = 3  # log, report pipe, status socket


def wanted() -> bool:
    """Whether workers fork from the zygote, on every device: unset or ``ASSAY_SANDBOX_ZYGOTE=1``,
    yes; ``=0``, never (each worker a fresh interpreter). The import it saves is 4-5 s of a GPU
    verification (an H200's L1_21: the worker's import 0.1 s forked, 4.4 s exec'd) and 2.5-3 s
    of a cpu one on the 2-core CPU machine. It was opt-in on cpu after five verifications of one
    ReLU kernel (a 16 MB output, which a heap may fault in anew on each call; see
    bench.timing.steady_host_allocator) spread 9.4% and 16.2% from their median forked, within 6%
    exec'd; measured again alternating (2026-12-03, `assay verify` of the bundled ReLU at its
    default size, five pairs), the two spread alike: runtimes 3.08-4.00 ms forked, 3.30-4.14 ms
    exec'd, the same machine's noise either way. The zygote never touches CUDA: its workers
    initialize it after the fork, as torch requires."""
    from assay.env import SANDBOX_ZYGOTE

    value = SANDBOX_ZYGOTE.get().strip().lower()
    return value not in ("0", "false", "no", "off")


def runs(cmd: list[str]) -> bool:
    """Whether ``cmd`` is the worker's command line, the one a zygote can run."""
    return len(cmd) == 4 and cmd[0] == sys.executable and tuple(cmd[1:3]) == WORKER


class Child:
    """A worker forked by the zygote, waited on like a ``subprocess.Popen``: ``pid``,
    ``wait(timeout)`` (raises ``subprocess.TimeoutExpired``), ``returncode`` (negative: the
    signal that ended it) and ``cpu_s`` (its CPU seconds and its reaped descendants')."""

    def __init__(self, pid: int, status: socket.socket):
        self.pid, self._status = pid, status
        self.returncode: int | None = None
        self.cpu_s = 0.0

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        ready = select.select([self._status], [], [], timeout)[0]
        if not ready:
            raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout)
        msg = messages.recv(self._status, _MAX_MSG)
        self._status.close()
        self.cpu_s = float(msg.get("cpu_s", 0.0))
        # the zygote gone before the child ended: the child died with it (PDEATHSIG)
        self.returncode = int(msg.get("returncode", -signal.SIGKILL))
        return self.returncode


class Zygote:
    """The harness's handle on a zygote: one per process and per value of the variables read
    at import (:data:`AT_IMPORT`), started on first use."""

    _lock = threading.Lock()
    _all: "dict[tuple, Zygote]" = {}
    _failed = False

    def __init__(self, proc: subprocess.Popen, ctl: socket.socket):
        self.proc, self.ctl = proc, ctl
        self._send = threading.Lock()
        self._ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def get(cls, env: dict[str, str]) -> "Zygote | None":
        """The running zygote for ``env``, started now if there is none (it imports torch
        while the caller goes on); None where it is not wanted (:func:`wanted`) or could
        not start (the caller execs the worker instead)."""
        if not wanted():
            return None
        key = tuple(env.get(k) for k in AT_IMPORT)
        with cls._lock:
            z = cls._all.get(key)
            if z is not None and z.proc.poll() is None:
                return z
            if cls._failed:
                return None
            try:
                cls._all[key] = z = cls._start(env)
            except (OSError, RuntimeError) as e:
                cls._failed = True
                log.warning("sandbox: no zygote (%s); each worker imports torch itself", e)
                return None
            return z

    @classmethod
    def _start(cls, env: dict[str, str]) -> "Zygote":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "assay.verify.sandbox", "--zygote",
                 str(theirs.fileno())], env=env, cwd="/", stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        return cls(proc, ours)  # importing torch now, while the caller goes on

    def _wait_ready(self) -> None:
        """Ready once torch is imported: a zygote that cannot import it is no zygote."""
        if self._ready:
            return
        if not select.select([self.ctl], [], [], 120)[0] \
                or messages.recv(self.ctl, _MAX_MSG).get("ready") is not True:
            raise OSError("the zygote did not come up")
        self._ready = True

    def spawn(self, spec: dict, cmd: list[str], log_fd: int, report_fd: int) -> Child:
        """Fork a launcher running ``cmd`` under ``spec``; raises OSError where the zygote is
        gone (the caller falls back to the exec path)."""
        body = json.dumps({"spec": spec, "cmd": cmd}).encode()
        if len(body) > _MAX_MSG:
            raise OSError(f"launcher spec of {len(body)} bytes")
        mine, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._send:
                self._wait_ready()
                socket.send_fds(self.ctl, [body], [log_fd, report_fd, child_end.fileno()])
        except OSError:
            mine.close()
            raise
        finally:
            child_end.close()
        if not select.select([mine], [], [], 30)[0]:
            mine.close()
            raise OSError("the zygote did not fork in 30 s")
        msg = messages.recv(mine, _MAX_MSG)
        if "pid" not in msg:
            mine.close()
            raise OSError(f"the zygote could not fork: {msg.get('error', 'no answer')}")
        return Child(int(msg["pid"]), mine)

    @classmethod
    def discard(cls, z: "Zygote") -> None:
        """Stop using ``z`` (it failed a request); later workers exec."""
        with cls._lock:
            cls._all = {k: v for k, v in cls._all.items() if v is not z}
            cls._failed = True
        log.warning("sandbox: the zygote stopped answering; each worker imports torch itself")
        try:
            z.ctl.close()
            z.proc.kill()
        except OSError:
            pass


# --- the zygote's side ----------------------------------------------------------------------

def serve(ctl_fd: int) -> int:
    """The zygote's loop: a fork per request, a status message per reaped child."""
    ctl = socket.socket(fileno=ctl_fd)
    importlib.import_module("torch")  # what every worker imports first, imported once here

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # it ends when the harness's socket closes
    children: dict[int, socket.socket] = {}
    try:
        ctl.send(json.dumps({"ready": True}).encode())
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the harness ended before it needed a worker: nothing to serve, no traceback
    while True:
        ready = select.select([ctl, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if ctl not in ready:
            continue
        try:
            body, fds, _, _ = socket.recv_fds(ctl, _MAX_MSG, _FDS)
        except OSError:
            body, fds = b"", []
        if not body:  # the harness is gone: so are its workers
            for pid in children:
                _killpg(pid)
            return 0
        if len(fds) != _FDS:
            for fd in fds:
                os.close(fd)
            continue
        log_fd, report_fd, status_fd = fds
        status = socket.socket(fileno=status_fd)
        try:
            req = json.loads(body)
            pid = os.fork()
        except (OSError, ValueError) as e:
            messages.send(status, error=str(e))
            status.close()
            os.close(log_fd)
            os.close(report_fd)
            continue
        if pid == 0:
            _child(req, log_fd, report_fd, [ctl, status, *children.values()])
        os.close(log_fd)
        os.close(report_fd)
        children[pid] = status
        messages.send(status, pid=pid)
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock = children.pop(pid, None)
        if sock is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        messages.send(sock, returncode=code, cpu_s=ru.ru_utime + ru.ru_stime)
        sock.close()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _child(req: dict, log_fd: int, report_fd: int, sockets: list[socket.socket]) -> None:
    """In the forked child: nothing of the zygote's is left open (its sockets closed through
    their objects, every other descriptor, the signal wake-up pipe too, by number), then the
    launcher, which never returns."""
    try:
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        for s in sockets:
            s.close()
        os.setsid()  # its own session and process group, as the exec path's Popen gives it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # Every other descriptor goes, whatever holds it: only the report pipe stays open.
        keep = os.dup2(report_fd, 3) if report_fd != 3 else 3
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        os.chdir("/")
        spec = req["spec"]
        spec["report_fd"] = keep
        from assay.verify.sandbox.launcher import launch

        launch(spec, req["cmd"], in_process=_worker)
    except BaseException as e:  # noqa: BLE001 - the child must never return into the zygote
        try:
            os.write(2, f"sandbox: zygote child failed: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    os._exit(127)


def _worker(cmd: list[str]) -> int:
    """The worker's ``python -m assay.verify.worker JOB_DIR``, in this process: what the
    interpreter of the exec path would read from its environment, set from the new one."""
    import tempfile

    tempfile.tempdir = None  # TMPDIR is the scratch folder now
    sys.dont_write_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE") == "1"
    from assay.verify import worker

    sys.argv = [worker.__file__, *cmd[3:]]  # as ``python -m`` sets it
    rc = worker.main(cmd[3:])
    sys.stdout.flush()
    sys.stderr.flush()
    return rc


__all__ = ["Child", "Zygote", "runs", "serve", "wanted"]
