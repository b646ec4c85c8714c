"""Compile kernel sources into shared libraries, cached by content hash.

This is the thin binding: a kernel source is plain C++ (cpu target) or CUDA (cuda target) with
``extern "C"`` entry points that take raw pointers, sizes and (for CUDA) a stream. It builds in
about a second with g++ and a few seconds with nvcc, against ~30 s for a torch extension that
includes ``torch/extension.h``. Candidates call ``load_library`` at import; the library is
loaded with ctypes and called with ``tensor.data_ptr()``.

The cache key covers the source, the compiler command and the target architecture, so a
library built on a machine without a GPU (nvcc only) is reused on the GPU machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

LANGS = ("cpp", "cuda")


class BuildError(RuntimeError):
    """The compiler rejected a source; ``log`` holds its output (fed to repair prompts)."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def cache_dir() -> Path:
    root = os.environ.get("ASSAY_KERNEL_CACHE") or Path.home() / ".cache" / "assay" / "kernels"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cuda_arch() -> str:
    """The architecture to build for: ``ASSAY_CUDA_ARCH`` (e.g. ``sm_90``) or the device's."""
    arch = os.environ.get("ASSAY_CUDA_ARCH")
    if arch:
        return arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"  # H100/H200: the product's device


@functools.cache
def host_cpu() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (a cache shared by
    machines of different CPUs keeps a library per kind)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + " " + platform.processor()
    keep = [ln for ln in info if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return platform.machine() + "\n" + "\n".join(dict.fromkeys(keep))


@functools.cache
def host_cpu_flags() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Compiler and linker flags of cpu kernels: the host's instruction set (AVX2, AVX-512, FMA,
    as ATen's own kernels pick at run time), and glibc's vector math where it is there (x86-64:
    ``omp simd`` loops then call vector exp/erf/tanh; see the offline synthesizer's preamble)."""
    libs: tuple[str, ...] = ()
    if platform.machine() == "x86_64" and ctypes.util.find_library("mvec"):
        libs = ("-lmvec",)
    return ("-march=native", *(("-DASSAY_LIBMVEC",) if libs else ())), libs


def nvcc_path() -> str | None:
    """The CUDA compiler builds use: $NVCC, else nvcc on PATH; None where there is none."""
    return os.environ.get("NVCC") or shutil.which("nvcc")


@dataclass(frozen=True)
class BuildSpec:
    source: str
    lang: str
    flags: tuple[str, ...] = ()

    def command(self, src: Path, out: Path) -> list[str]:
        if self.lang == "cpp":
            cxx = os.environ.get("CXX", "g++")
            isa, libs = host_cpu_flags()
            return [cxx, "-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", *isa, *self.flags,
                    str(src), "-o", str(out), *libs]
        if self.lang == "cuda":
            nvcc = nvcc_path() or "nvcc"
            return [nvcc, "-O3", "-std=c++17", f"-arch={cuda_arch()}", "--shared",
                    "-Xcompiler", "-fPIC", *self.flags, str(src), "-o", str(out)]
        raise BuildError(f"unknown kernel language {self.lang!r} (choose from {LANGS})")

    @property
    def suffix(self) -> str:
        return ".cpp" if self.lang == "cpp" else ".cu"

    def key(self) -> str:
        h = hashlib.sha256()
        h.update(self.source.encode())
        h.update(" ".join(self.command(Path("src"), Path("out"))).encode())
        if self.lang == "cpp":  # -march=native: a library is for this kind of CPU only
            h.update(host_cpu().encode())
        return h.hexdigest()[:24]


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[bool]:
    """Hold the shared cache's lock file ``path``: yields True, or False (nothing held) where
    the lock file is not ours to open. The sandbox hands whatever a run created in the shared
    cache to root, read-only (assay.verify.sandbox), so a lock file an earlier run left behind
    refuses a later run: that run builds outside the cache rather than fail the candidate."""
    lock = FileLock(str(path))
    try:
        lock.acquire()
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def build(source: str, lang: str = "cpp", flags: tuple[str, ...] = (),
          timeout_s: float = 300.0) -> Path:
    """Compile ``source`` (or reuse the cached build) and return the shared library's path."""
    spec = BuildSpec(source, lang, tuple(flags))
    key = spec.key()
    root = cache_dir()
    lib = root / f"{key}.so"
    if lib.exists():
        return lib
    with cache_lock(root / f"{key}.lock") as shared:
        if shared and lib.exists():  # another process built it while we waited
            return lib
        if not shared:  # a private build, kept for this process's life
            lib = Path(tempfile.mkdtemp(prefix=f"assay-build-{key}.")) / f"{key}.so"
        with tempfile.TemporaryDirectory(dir=lib.parent, prefix=f"{key}.") as tmp:
            src = Path(tmp) / f"kernel{spec.suffix}"
            src.write_text(source)
            out = Path(tmp) / "kernel.so"
            try:
                proc = subprocess.run(spec.command(src, out), capture_output=True, text=True,
                                      timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise BuildError(f"compiler timed out after {timeout_s:.0f} s") from None
            except FileNotFoundError as e:
                raise BuildError(f"compiler not found: {e.filename}") from None
            if proc.returncode != 0:
                log = (proc.stdout + proc.stderr).replace(str(src), f"kernel{spec.suffix}")
                raise BuildError(f"{lang} build failed (exit {proc.returncode})", log)
            os.replace(out, lib)  # atomic: a half-written library is never seen as built
    return lib


def is_cached(source: str, lang: str = "cpp", flags: tuple[str, ...] = ()) -> bool:
    return (cache_dir() / f"{BuildSpec(source, lang, tuple(flags)).key()}.so").exists()


class _BuildOnly:
    """Stands in for a library in build-only mode: the compile service imports a candidate
    just to fill the cache, with no GPU, so nothing may be loaded or called."""

    def __getattr__(self, name: str) -> "_BuildOnly":
        return self

    def __call__(self, *args, **kwargs):
        raise RuntimeError("kernel libraries are not callable in build-only mode")


def build_all(sources: tuple[str, ...] | list[str], lang: str = "cpp") -> None:
    """Build each of ``sources`` (or find it cached), a quarter of the cores' compilers at a
    time: the compile service builds up to four candidates at once beside the GPU's timed work,
    and a level-3 network's offline plan has dozens of libraries (KernelBench's L3_26, 59)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 1) // 4))) as pool:
        list(pool.map(lambda source: build(source, lang), sources))


def load_library(source: str, lang: str = "cpp", flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Build if needed and load with ctypes. Entry points must be ``extern "C"``."""
    path = build(source, lang, flags)
    if os.environ.get("ASSAY_BUILD_ONLY"):
        return _BuildOnly()  # type: ignore[return-value]
    return ctypes.CDLL(str(path))
