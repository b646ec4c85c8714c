"""Run an untrusted command (the candidate's worker) in a sandbox, and say what the sandbox was.

Each layer is applied where this machine allows it; the returned :class:`Outcome` records, per
layer, what was applied or why not, so a verdict can say so.

- ``session``: its own session and process group; killed as a group at the end.
- ``pid_namespace``: the worker is process 1 of a new pid namespace, so when it ends the kernel
  ends everything it started (even what left the process group), and it sees no other process.
- ``network``: a new network namespace; its only interface, loopback, is down (no 127.0.0.1,
  no DNS, no outward connection).
- ``filesystem``: a mount namespace in which every mount is read-only except bind mounts of
  the scratch folder and the kernel cache; /tmp, /dev/shm, the results tree and the repository
  refuse writes (EROFS).
- ``user``: as root, the worker runs as a dedicated unprivileged uid (one per concurrent
  sandbox, ``ASSAY_SANDBOX_UID`` + slot), so it cannot signal the harness, cannot undo the
  read-only mounts, and RLIMIT_NPROC binds. Directories it must read that only root may enter
  (a Python under /root) are shown to it through a read-only tmpfs that holds only those paths.
  Where that cannot be arranged it runs as root with every capability dropped.
- ``processes``: RLIMIT_NPROC (binds a non-root uid only) and a pids cgroup where cgroups are
  writable.
- ``memory``: RLIMIT_AS per process on the cpu target (CUDA maps far more address space than it
  uses), and a memory cgroup for the whole tree on every target where cgroups are writable.
- ``limits``: CPU seconds, open files, file size; no core dumps; no new privileges (setuid
  binaries do not elevate).

The setup runs in a launcher process (``python -m assay.verify.sandbox --launch``) that then
execs the worker; the harness itself (threaded, with torch) never forks into setup code. The
launcher reports what it applied through a pipe it closes before the exec, so the candidate
cannot forge the report.

Kernel cache: the worker builds into the shared cache (``ASSAY_KERNEL_CACHE``, default
``~/.cache/assay/kernels``) so identical kernels compile once. The folder is made group-writable
for the sandbox group with the sticky bit (a sandbox uid cannot replace or delete a file it does
not own), and after each run everything the sandbox uid created there is handed to root and made
read-only, so a later candidate cannot alter a library another one built. A candidate can still
plant a library under a key that a future source would hash to; ``ASSAY_SANDBOX_PRIVATE_CACHE=1``
gives each run a private cache in its scratch folder instead (every kernel is then rebuilt).
``ASSAY_SANDBOX_DISABLE=uid,mount,pidns,net,cgroup`` turns layers off (tests of the fallbacks).

The package follows the two processes: ``parent`` (:func:`run_sandboxed`, :class:`Outcome`:
plan, launch, wait, clean up) runs in the harness, with ``host`` (uid slots, the read plan for
an unprivileged uid, the kernel cache's permissions, scratch clean-up) and ``cgroups``;
``launcher`` (``__main__``) runs in the launcher process, with ``mounts`` and ``libc``.
``zygote`` (the default; ``ASSAY_SANDBOX_ZYGOTE=0``: an exec per worker): the worker's
launcher forked from a process that imported torch already (one per harness process;
:func:`prestart_worker` starts it early), the same layers set up after the fork.
"""

from assay.verify.sandbox.parent import Outcome, prestart_worker, run_sandboxed

__all__ = ["Outcome", "prestart_worker", "run_sandboxed"]
