"""The step server: a campaign's steps forked from one process that imported torch already.

Every rule of the DAG runs ``python -m assay.steps <rule> [overrides]`` (``assay/steps/
__main__.py``), and most steps import torch, Hydra and the package they call first: 2.5-4.5 s of
each job on the 2-core CPU machine (the CI campaign's 32 jobs spent about 80 s of its 90 importing),
4-5 s on an H200 (hundreds of jobs per KernelBench level). The command is a thin client: it
connects to a server for its interpreter, environment and working folder, starting one if none
runs, and the server forks the step. The step then runs exactly as ``python -m assay.steps.<rule>``
would: the client's environment (all of it), working folder, umask, standard streams (passed as
descriptors, so ``> {log} 2>&1`` still lands in the rule's log) and command line; its exit status
is the client's. Nothing of a step is cached: only imports are shared.

Kill semantics are those of a process: a signal the client gets (Snakemake's SIGTERM, a
terminal's SIGINT) goes to the step's process group, and a client that dies without a word
(SIGKILL) takes the step with it. The step dies with the server too (PDEATHSIG).

Why the environment, interpreter and folder key the server: a module reads some variables when
it loads (OpenMP's thread count, the import path), so a server serves only clients whose
environment is its own; its sources' and import folders' modification times are in the key too,
so an edited checkout or an installed package gets a new server. A server exits after
``ASSAY_STEP_SERVER_IDLE`` seconds with no step running.

Who may connect: the socket lives in a folder only this user may enter (``0700``, checked), the
peer must be this uid (``SO_PEERCRED``) and in this process's mount and network namespaces, so a
sandboxed candidate (namespaces of its own, another uid) cannot ask for a step. Off with
``ASSAY_STEP_SERVER=0``, and under SLURM (each job in its own allocation and cgroup): the step
then runs in the client's process, as before.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from assay import messages

log = logging.getLogger("assay.stepserver")

# Imported once by the server, before it forks: what the steps spend their start on (torch, the
# synthesizer's tracer, the verifier's harness, the device probe, Hydra). Not polars or MLflow:
# polars warns at a fork after its import, and the steps that use either are one per campaign.
PREIMPORT = ("torch", "numpy", "hydra", "omegaconf", "torch.fx.experimental.symbolic_shapes",
             "torch._dynamo", "torch.utils.flop_counter", "assay.app", "assay.propose.offline",
             "assay.verify.harness", "assay.bench.device", "assay.bench.baseline",
             "assay.tasks.record", "assay.tasks.analyze")
# Differ between two shells of one job's lineage without changing anything a step reads.
VOLATILE = ("_", "PWD", "OLDPWD", "SHLVL")
# What a client passes on to its step; anything else it receives ends it as usual.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
_MAX_MSG = 1 << 22  # a request carries the environment
_CONNECT_S = 15.0  # a new server binds its socket at once, before its imports
_RESTART_S = 3.0


class NoServer(Exception):
    """The step could not be handed to a server (the caller runs it in its own process)."""


def wanted() -> bool:
    """On unless ``ASSAY_STEP_SERVER=0`` or inside a SLURM job (its steps must stay in their
    job's allocation) or off Linux (``SO_PEERCRED``, PDEATHSIG)."""
    from assay.env import STEP_SERVER

    if STEP_SERVER.get().strip().lower() in ("0", "false", "no", "off"):
        return False
    return sys.platform.startswith("linux") and not os.environ.get("SLURM_JOB_ID")


def idle_s() -> float:
    from assay.env import STEP_SERVER_IDLE

    try:
        return max(1.0, float(STEP_SERVER_IDLE.get()))
    except ValueError:
        return 30.0


def socket_dir() -> Path:
    """This user's folder of step-server sockets, made ``0700`` and checked to be so."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base, "assay-steps") if base and os.path.isdir(base) \
        else Path(tempfile.gettempdir(), f"assay-steps-{os.getuid()}")
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError as e:
        raise NoServer(f"socket folder {d}: {e.strerror or e}") from e
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise NoServer(f"socket folder {d} is not a folder of this user's alone (mode 0700)")
    return d


def server_key(env: dict[str, str], cwd: str) -> str:
    """What a server must share with its clients: interpreter, environment, folder, sources."""
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0{cwd}\0".encode())
    for k in sorted(env):
        if k not in VOLATILE:
            h.update(f"{k}={env[k]}\0".encode())
    pkg = Path(__file__).parent
    for root, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py"):
                st = os.stat(os.path.join(root, n))
                h.update(f"{root}/{n}:{st.st_mtime_ns}:{st.st_size}\0".encode())
    for p in sys.path:  # an installed or upgraded package changes its folder's time
        if p in ("", cwd):
            continue  # (the working folder: in the key already, and the steps write there)
        try:
            h.update(f"{p}:{os.stat(p or '.').st_mtime_ns}\0".encode())
        except OSError:
            pass
    return h.hexdigest()[:20]


# --- the client ----------------------------------------------------------------------------

def run_step(rule: str, args: list[str]) -> int:
    """Run ``assay.steps.<rule>`` with ``args`` on a server (started if none runs); its exit
    status (negative: the signal that ended it). Raises :class:`NoServer` where the step was not
    started there."""
    env, cwd = dict(os.environ), os.getcwd()
    path = socket_dir() / f"{server_key(env, cwd)}.sock"
    sock = _connect(path, env, cwd)
    request = json.dumps({"rule": rule, "args": args, "env": env, "cwd": cwd,
                          "umask": _umask()}).encode()
    try:
        socket.send_fds(sock, [request], [0, 1, 2])
    except OSError as e:
        raise NoServer(f"request not sent: {e}") from e
    first = messages.recv(sock, _MAX_MSG)
    if "pid" not in first:
        sock.close()
        raise NoServer(first.get("error", "the server closed the connection"))

    def forward(signum, _frame):
        messages.send(sock, signal=signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    msg = messages.recv(sock, _MAX_MSG)  # (PEP 475: waits on after a forwarded signal)
    if "returncode" not in msg:
        print("assay: the step server ended while the step ran", file=sys.stderr)
        return 1
    return int(msg["returncode"])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _connect(path: Path, env: dict[str, str], cwd: str) -> socket.socket:
    start = time.monotonic()
    started = -_RESTART_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(str(path))
            return sock
        except OSError as e:
            sock.close()
            if e.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                raise NoServer(f"{path}: {e.strerror or e}") from e
        now = time.monotonic() - start
        if now - started >= _RESTART_S:  # (again: one that found a server leaving exits)
            _start_server(path, env, cwd)
            started = now
        if now > _CONNECT_S:
            raise NoServer(f"no step server answered at {path} in {_CONNECT_S:.0f} s "
                           f"(its log: {path.with_suffix('.log')})")
        time.sleep(0.05)


def _start_server(path: Path, env: dict[str, str], cwd: str) -> None:
    """A server detached from this process (a session of its own; it outlives this client)."""
    with open(path.with_suffix(".log"), "ab") as out:
        subprocess.Popen([sys.executable, "-m", "assay.stepserver", str(path)], env=env, cwd=cwd,
                         stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                         start_new_session=True)


# --- the server ----------------------------------------------------------------------------

def serve(path: Path) -> dict | None:
    """Bind ``path`` (unless another server holds it), import :data:`PREIMPORT`, and fork a
    step per request until idle. Returns, in a forked child, its request (the caller runs the
    step); in the server, None when it is done."""
    from assay.layout import try_flock

    lock = try_flock(path.with_suffix(".lock"), 0o600)
    if lock is None:
        return None  # a server of this key runs already
    try:
        path.unlink()  # left by a server that was killed
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(64)
    t0 = time.monotonic()
    import importlib

    for name in PREIMPORT:
        importlib.import_module(name)
    _log(f"server {os.getpid()} up at {path} (imports {time.monotonic() - t0:.1f} s)")

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
    own_ns = _namespaces(os.getpid())
    steps: dict[socket.socket, int | None] = {}  # a client's connection: its step's pid
    idle_since, refused = time.monotonic(), 0
    while True:
        timeout = None if steps else max(0.0, idle_since + idle_s() - time.monotonic())
        ready = select.select([listener, wake_r, *steps], [], [], timeout)[0]
        if not ready and not steps:
            break  # idle
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(steps)
        if listener in ready:
            conn, _ = listener.accept()
            why = _refuse(conn, own_ns)
            if why:
                if why != GONE:  # (a client killed while it waited: nothing to say)
                    _log(f"refused a connection: {why}")
                    refused += 1
                conn.close()
            else:
                steps[conn] = None
        for conn in [c for c in ready if c in steps]:
            pid = steps[conn]
            if pid is None:
                req = _request(conn)
                if req is None:
                    del steps[conn]
                    conn.close()
                    continue
                try:
                    child = os.fork()
                except OSError as e:
                    messages.send(conn, error=f"fork: {e}")
                    _close_fds(req["fds"])
                    del steps[conn]
                    conn.close()
                    continue
                if child == 0:
                    _in_child([listener, *steps], [wake_r, wake_w, lock], req)
                    return req
                _close_fds(req["fds"])
                steps[conn] = child
                messages.send(conn, pid=child)
                continue
            msg = messages.recv(conn, _MAX_MSG)
            if "signal" in msg and int(msg["signal"]) in FORWARDED:
                _killpg(pid, int(msg["signal"]))
            elif not msg:  # the client died (SIGKILL): so does its step
                _killpg(pid, signal.SIGKILL)
                del steps[conn]
                conn.close()
        _reap(steps)
        if steps or ready:
            idle_since = time.monotonic()
    # Its files go while the lock is held (no server binds the path before it is gone); the log
    # stays where it says more than that the server came up.
    path.unlink(missing_ok=True)
    path.with_suffix(".lock").unlink(missing_ok=True)
    if not refused:
        path.with_suffix(".log").unlink(missing_ok=True)
    else:
        _log(f"server {os.getpid()} idle {idle_s():.0f} s: done")
    return None


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def _namespaces(pid: int) -> tuple[str, ...]:
    return tuple(os.readlink(f"/proc/{pid}/ns/{ns}") for ns in ("mnt", "net"))


GONE = "gone"


def _refuse(conn: socket.socket, own_ns: tuple[str, ...]) -> str | None:
    """Why a peer may not have a step: not this uid, or namespaces of its own (a sandbox); or
    :data:`GONE`, a client that ended before its connection was accepted."""
    import struct

    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
    except OSError as e:
        return f"no credentials ({e})"
    if uid != os.getuid():
        return f"uid {uid}"
    if pid <= 0:  # (another pid namespace's process: it has no pid here)
        return f"pid {pid} is in other namespaces"
    try:
        if _namespaces(pid) != own_ns:
            return f"pid {pid} is in other namespaces"
    except FileNotFoundError:
        return GONE
    except OSError as e:
        return f"pid {pid}: {e}"
    return None


def _is_step(rule: object) -> bool:
    """A module of ``assay.steps`` (a rule's step), found by name: the server imports none."""
    import importlib.util

    return isinstance(rule, str) and rule.isidentifier() and not rule.startswith("_") \
        and importlib.util.find_spec(f"assay.steps.{rule}") is not None


def _request(conn: socket.socket) -> dict | None:
    try:
        body, fds, _, _ = socket.recv_fds(conn, _MAX_MSG, 3)
        req = json.loads(body) if body else None
    except (OSError, ValueError):
        return None
    if req is None or len(fds) != 3 or not _is_step(req.get("rule")):
        _close_fds(fds)
        if req is not None:
            messages.send(conn, error=f"not a step: {req.get('rule')!r}")
        return None
    req["fds"] = fds
    return req


def _reap(steps: dict[socket.socket, int | None]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        for conn, p in list(steps.items()):
            if p == pid:
                messages.send(conn, returncode=code)
                del steps[conn]
                conn.close()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _in_child(sockets: list[socket.socket], fds: list[int], req: dict) -> None:
    """The forked step's process made the client's: its own process group (the server signals
    it there), the server's descriptors closed, the client's streams, folder, umask and
    environment. Dies with the server."""
    import ctypes

    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    for s in sockets:
        s.close()
    _close_fds(fds)
    for i, fd in enumerate(req.pop("fds")):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(req["cwd"])
    os.umask(int(req["umask"]))
    os.environ.clear()
    os.environ.update(req["env"])
    tempfile.tempdir = None  # as a fresh interpreter: TMPDIR is read again
    np = sys.modules.get("numpy")
    if np is not None:  # its global generator was seeded at import, in the server (random's
        np.random.seed()  # reseeds itself at a fork)
    if sys.path and sys.path[0] != req["cwd"]:
        sys.path[0] = req["cwd"]  # `python -m` puts the working folder first


def run_here(rule: str, args: list[str]) -> None:
    """Run ``assay.steps.<rule>`` in this process as ``python -m`` would; never returns."""
    import runpy
    import traceback

    from assay.process import exit_now

    sys.argv = [f"assay.steps.{rule}", *args]  # (runpy sets argv[0] to the module's file)
    code = 0
    try:
        runpy.run_module(f"assay.steps.{rule}", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as Python ends on an uncaught ^C
        code = 130
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the status
        traceback.print_exc()
        code = 1
    exit_now(code)


def main(argv: list[str]) -> None:
    req = serve(Path(argv[0]))
    if req is None:
        sys.exit(0)
    run_here(req["rule"], req["args"])


if __name__ == "__main__":
    main(sys.argv[1:])
