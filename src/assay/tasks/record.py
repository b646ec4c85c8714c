"""One task's record (sizes, FLOPs, minimum bytes, degeneracy), measured in a child process.

A task file is code: it can sleep at import, loop in forward, call sys.exit, or ask for a
terabyte. So the task is executed in a child process (``python -m assay.tasks.record
--analyze SPEC``, or a fork of the step where it has torch imported) with a time limit
(``tasks.extract_timeout_s``) and, on the cpu target, an address-space limit; its sizes are checked on the meta device before anything is allocated
(``tasks.max_task_bytes``, null: a quarter of RAM on cpu or half the GPU's memory on cuda).
A task that cannot be used gets a record whose ``error`` is one line naming the file and the
problem; the campaign goes on. The step `extract` (``assay.steps.extract``) writes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from assay.tasks.model import TaskError, one_line


# --- the parent: runs the child ----------------------------------------------------------------


def analyze_file(path: str | Path, level: int, size: str, target: str, *, timeout_s: float,
                 max_bytes: int | None = None,
                 device_lock: str | Path | None = None) -> dict[str, Any]:
    """The task's record fields, computed in a child process; ``error`` is None or one line
    naming the file and the problem. ``timeout_s`` and ``max_bytes`` are the config's
    ``tasks.extract_timeout_s`` and ``tasks.max_task_bytes`` (None: see ``max_task_bytes``).
    ``device_lock`` (``assay.gpu.device_lock``): the child takes the GPU there before its first
    use of it, after its imports and the file's execution; the time it waits for it is not
    counted against ``timeout_s``."""
    from assay.layout import stop_cleanly_on_signals

    stop_cleanly_on_signals()  # a SIGTERM to the step kills the child too
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="assay-extract-") as tmp:
        out, stage = Path(tmp) / "record.json", Path(tmp) / "stage"
        spec = {"path": str(path), "level": level, "size": size, "target": target,
                "out": str(out), "stage": str(stage), "parent": os.getpid(),
                "max_bytes": max_bytes, "device_lock": device_lock and str(device_lock)}
        t0 = time.monotonic()
        with open(Path(tmp) / "log", "wb") as logf:
            proc = _start_child(spec, logf.fileno())
            try:
                code = _wait(proc, stage, timeout_s, device_lock)
            except BaseException:
                _kill(proc)
                raise
            finally:
                _kill(proc)  # what the task started goes with it
        where = stage.read_text().strip() if stage.exists() else "starting"
        if code is None:
            return _error(f"{path}: timed out after {timeout_s:.0f} s while {where} (a task "
                          f"must load and run in time; tasks.extract_timeout_s sets the limit)")
        if out.exists():
            try:
                return json.loads(out.read_text())
            except ValueError:
                pass
        tail = " ".join((Path(tmp) / "log").read_bytes()[-300:].decode(errors="replace").split())
        if code < 0:
            what = f"was killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                what += " (out of memory?)"
        else:
            what = f"ended the process with exit status {code}"
        took = time.monotonic() - t0
        return _error(f"{path}: the task {what} while {where} after {took:.0f} s"
                      + (f": {tail}" if tail else ""))


def _start_child(spec: dict, log_fd: int) -> "subprocess.Popen | _Forked":
    """The analysis in a process of its own (a session too: killed with all it starts): forked
    where this process imported torch, runs no other thread (no thread pool a child would
    inherit half of: a step forked by the step server, before any torch work) and has not
    touched CUDA, so the 1.5-5 s import is not paid again; else a fresh interpreter."""
    torch = sys.modules.get("torch")
    if torch is None or _os_threads() > 1 or torch.cuda.is_initialized():
        cmd = [sys.executable, "-m", "assay.tasks.record", "--analyze", json.dumps(spec)]
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_fd,
                                stderr=subprocess.STDOUT, start_new_session=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        code = _analyze_main(spec)
    except BaseException:  # noqa: BLE001 - the child never returns into the step
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 2  # (not Linux: no fork)


class _Forked:
    """A forked child waited on as a ``subprocess.Popen``: ``pid``, ``wait(timeout)``."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"analysis {self.pid}", timeout)
            else:
                time.sleep(0.01)
        return self.returncode


WAITING = "waiting for the GPU"


def _wait(proc: subprocess.Popen, stage: Path, timeout_s: float,
          device_lock: str | Path | None = None, poll_s: float = 0.25) -> int | None:
    """The child's exit status, or None after ``timeout_s`` of its time not spent waiting for
    the GPU: another job's device work is not the task's. It waits when its stage file says
    so and another process holds ``device_lock`` (a task that only writes the words into its
    stage file gets no time)."""
    from assay.gpu import lock_busy

    limit = time.monotonic() + timeout_s
    while True:
        t = time.monotonic()
        try:
            return proc.wait(timeout=max(0.0, min(poll_s, limit - t)))
        except subprocess.TimeoutExpired:
            pass
        try:
            waiting = device_lock is not None and stage.read_text().strip() == WAITING
        except OSError:
            waiting = False
        if waiting and lock_busy(device_lock):
            limit += time.monotonic() - t
        if time.monotonic() >= limit:
            return None


def _error(line: str) -> dict[str, Any]:
    return {"error": " ".join(line.split())}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# --- the child: executes the task --------------------------------------------------------------


def _stage(spec: dict, what: str) -> None:
    """Say what the child does now (the parent names it in a timeout's line) and note when it
    began (the record's ``analysis_s``: where an extract's seconds went)."""
    spec.setdefault("_began", []).append((what, time.monotonic()))
    with open(spec["stage"], "w") as f:
        f.write(what)


def _stage_seconds(spec: dict) -> dict[str, float]:
    """Seconds per stage, in order, the last one until now."""
    began = [*spec.get("_began", []), ("", time.monotonic())]
    return {what: round(t1 - t0, 3) for (what, t0), (_, t1) in zip(began, began[1:])}


def _ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _fmt(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def max_task_bytes(target: str, configured: int | None = None) -> tuple[int, str]:
    """The most bytes a task's inputs, weights and outputs may take, and where that comes from:
    ``tasks.max_task_bytes`` when set, else a share of the device's memory."""
    if configured:
        return int(configured), "tasks.max_task_bytes"
    if target == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        return total // 2, f"half of the GPU's {_fmt(total)}; tasks.max_task_bytes raises it"
    ram = _ram_bytes()
    return ram // 4, f"a quarter of this machine's {_fmt(ram)} RAM; tasks.max_task_bytes raises it"


SCALARS = (bool, int, float, type(None))


def _check_values(path: Path, what: str, values: Any, need_tensor: bool) -> list:
    import torch

    if not isinstance(values, (list, tuple)):
        raise TaskError(f"{path}: {what} returned a {type(values).__name__}, expected a list")
    for i, v in enumerate(values if need_tensor else ()):  # constructors take anything
        if not isinstance(v, (torch.Tensor, *SCALARS)):
            raise TaskError(f"{path}: {what} element {i} is a {type(v).__module__}."
                            f"{type(v).__name__}, expected torch tensors or numbers")
    if need_tensor and not any(isinstance(v, torch.Tensor) for v in values):
        kinds = ", ".join(type(v).__name__ for v in values) or "an empty list"
        raise TaskError(f"{path}: {what} returned no tensor ({kinds})")
    return list(values)


def _nbytes(xs) -> int:
    import torch

    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def _size_words(shapes: str, weights: int, outputs: bool) -> str:
    what = [f"inputs {shapes}"] + ([f"{_fmt(weights)} of weights"] if weights else []) \
        + (["outputs"] if outputs else [])
    return (", ".join(what[:-1]) + " and " + what[-1]) if len(what) > 1 else what[0]


def _sized(measured: dict[str, Any]) -> tuple[int, str]:
    """Bytes of inputs, weights and outputs, and what they are in words, from ``cost``."""
    shapes = ", ".join(str(tuple(x["shape"])) for x in measured["inputs"] if "shape" in x)
    return int(measured["min_bytes"]), _size_words(shapes, int(measured["weight_bytes"]), True)


def _size_on_meta(module, init: list) -> tuple[int, str] | None:
    """What :func:`_sized` says, where the forward has no meta kernel (``cost`` could not
    count it there): inputs and weights measured on the meta device, outputs too where the
    forward runs there; None when the task cannot be built there (then the real run is bounded
    by the rlimit)."""
    import torch

    from assay.tasks.instantiate import as_outputs, seeded

    try:
        with torch.device("meta"), seeded(0):
            model = module.Model(*init)
            inputs = module.get_inputs()
    except Exception:  # noqa: BLE001 - errors are reported by the real run below
        return None
    if not isinstance(inputs, (list, tuple)) or not isinstance(model, torch.nn.Module):
        return None
    weights = _nbytes(list(model.parameters()) + list(model.buffers()))
    total, outputs = _nbytes(inputs) + weights, False
    try:
        with torch.device("meta"), torch.no_grad():
            total += _nbytes(as_outputs(model(*inputs)))
        outputs = True
    except Exception:  # noqa: BLE001
        pass
    shapes = ", ".join(f"{tuple(x.shape)}" for x in inputs if isinstance(x, torch.Tensor))
    return total, _size_words(shapes, weights, outputs)


def _check_size(task, sized: tuple[int, str] | None, cap: int, why: str) -> None:
    if sized is not None and sized[0] > cap:
        raise TaskError(f"{task.path}: absurd size: {sized[1]} need {_fmt(sized[0])} at size "
                        f"{task.size}, more than {_fmt(cap)} ({why})")


def analyze(spec: dict) -> dict[str, Any]:
    """Load, validate and measure one task in this (child) process."""
    path = Path(spec["path"])
    _stage(spec, "reading the file")
    from assay.tasks.model import Task, resolve_size

    target = spec["target"]
    if target == "auto":
        _stage(spec, "importing torch")
        import torch

        target = "cuda" if torch.cuda.is_available() else "cpu"
    size = resolve_size(spec["size"], target)
    task = Task.from_file(path, size=size, level=spec["level"])
    device = "cuda" if target == "cuda" else "cpu"

    _stage(spec, "executing the file")
    import torch

    from assay.tasks.analyze import cost, degeneracy

    module = task.module()

    _stage(spec, "calling get_init_inputs()")
    try:
        init = module.get_init_inputs()
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"{path}: get_init_inputs() raised {one_line(e)}") from None
    init = _check_values(path, "get_init_inputs()", init, need_tensor=False)

    # What the meta device tells (sizes, FLOPs: CPU work, seconds at KernelBench's sizes on
    # an H200) comes before the GPU is taken, in one pass; running anything for real waits for
    # the sizes' check against the device's memory.
    _stage(spec, "sizing the task and counting its FLOPs on the meta device")
    measured = cost(task, real=False)
    sized = _sized(measured) if measured else _size_on_meta(module, init)
    if spec.get("device_lock"):  # the first use of the device is next (its memory's size)
        from assay.gpu import hold_device_lock

        _stage(spec, WAITING)
        hold_device_lock(spec["device_lock"])
    _stage(spec, "checking the sizes against the memory")
    _check_size(task, sized, *max_task_bytes(target, spec.get("max_bytes")))

    _stage(spec, "constructing Model(*get_init_inputs())")
    if not issubclass(module.Model, torch.nn.Module):
        raise TaskError(f"{path}: Model is not a torch.nn.Module subclass")
    checked = [_checked_forward(spec, path, module, device)]  # (model, outputs)

    record: dict[str, Any] = {"error": None, "number": task.number, "name": task.name,
                              "size": task.size, "source_hash": task.source_hash,
                              "source": task.source, "functional_source": None, "target": target}
    _stage(spec, "analyzing degeneracy")
    # the checked forward is degeneracy's base run: not built and run again
    record["degeneracy"] = degeneracy(task, device=device, base=checked.pop())
    if measured is None:  # an op without a meta kernel: counted on the CPU for real
        _stage(spec, "measuring FLOPs and bytes on the CPU")
        measured = cost(task)
    record.update(measured)
    record["analysis_s"] = _stage_seconds(spec)
    return record


def _checked_forward(spec: dict, path: Path, module, device: str) -> tuple:
    """The reference model and its outputs on the first input set, as the verifier and
    ``degeneracy``'s base run make them (``BASE_MODEL_SEED``, ``BASE_INPUT_SEED``), each step's
    failure one line: the constructor, ``get_inputs()`` (its values drawn on the device, as
    every later step draws them), the forward, its outputs' type and NaN."""
    import torch

    from assay.tasks.analyze import BASE_INPUT_SEED, BASE_MODEL_SEED
    from assay.tasks.instantiate import NotAList, as_outputs, make_inputs, reference_model

    try:
        model = reference_model(module, BASE_MODEL_SEED, device)
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"{path}: Model(*get_init_inputs()) raised {one_line(e)}") from None

    _stage(spec, "calling get_inputs()")
    try:
        inputs = make_inputs(module, BASE_INPUT_SEED, device)
    except NotAList as e:
        raise TaskError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"{path}: get_inputs() raised {one_line(e)}") from None
    _check_values(path, "get_inputs()", inputs, need_tensor=True)

    _stage(spec, "running forward")
    try:
        with torch.no_grad():
            value = model(*inputs)
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"{path}: forward raised {one_line(e)}") from None
    del inputs
    try:
        outs = as_outputs(value)
    except TypeError:
        raise TaskError(f"{path}: forward returned a {type(value).__name__}, expected a tensor "
                        f"or a tuple of tensors") from None
    for i, o in enumerate(outs):
        if o.is_floating_point() or o.is_complex():
            nan = int(torch.isnan(o).sum())
            if nan:
                raise TaskError(f"{path}: forward returns NaN in {nan} of {o.numel()} elements "
                                f"of output {i} on random inputs; a reference with NaN cannot "
                                f"check a kernel")
    return model, outs


def _analyze_main(spec: dict) -> int:
    import ctypes
    import resource

    try:  # end with the step, even when it is SIGKILLed
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != spec.get("parent", os.getppid()):
        return 1

    if spec["target"] != "cuda":  # CUDA maps far more address space than it uses
        ram = _ram_bytes()
        try:
            resource.setrlimit(resource.RLIMIT_AS, (ram, ram))
        except (ValueError, OSError):
            pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        record = analyze(spec)
    except TaskError as e:
        record = _error(str(e))
    except SystemExit as e:  # from get_inputs, forward...: one line, not a silent exit
        record = _error(f"{spec['path']}: the task calls sys.exit({e.code!r}) while "
                        f"{Path(spec['stage']).read_text().strip()}")
    except MemoryError as e:
        record = _error(f"{spec['path']}: out of memory while "
                        f"{Path(spec['stage']).read_text().strip()}: {one_line(e)}")
    except Exception as e:  # noqa: BLE001 - whatever the task does is the task's error
        record = _error(f"{spec['path']}: {one_line(e)} while "
                        f"{Path(spec['stage']).read_text().strip()}")
    tmp = spec["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, default=str)
    os.replace(tmp, spec["out"])
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["--analyze"] or len(sys.argv) != 3:
        print("usage: python -m assay.tasks.record --analyze SPEC_JSON", file=sys.stderr)
        sys.exit(2)
    from assay.process import exit_now

    exit_now(_analyze_main(json.loads(sys.argv[2])))  # (its record is written: no teardown)
