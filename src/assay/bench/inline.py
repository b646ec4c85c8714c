"""Fast builds for ``torch.utils.cpp_extension.load_inline`` candidates (the format LLMs and
KernelBench write): the same sources never build twice, and a cold build compiles less.

torch keys its JIT builds on the extension's *name* in a per-process versioner and a build
folder under ``TORCH_EXTENSIONS_DIR``; the sandbox gives every run a fresh one, so each
verification (and the compile service's prebuild before it) rebuilt everything (~45 s on an
H100 host). :func:`install` replaces ``load_inline`` in the worker and the prebuild process
with :func:`cached_load_inline`, which

- keys the build by content: the sources, the bindings, every flag, the extension name (the
  module's init symbol), the torch and Python versions, the compilers and the architecture;
- keeps the built module as one file ``inline-<key>.so`` in the shared kernel cache
  (``assay.bench.build.cache_dir``, the folder the sandbox already shares, freezes and
  documents), so a second build of the same content is an import (milliseconds) in any worker;
- builds for the device's architecture only (``TORCH_CUDA_ARCH_LIST`` from
  ``assay.bench.build.cuda_arch``: the prebuild sees no GPU, and torch would otherwise build for
  every architecture it knows), with ninja running the C++ and CUDA compiles in parallel;
- compiles the CUDA sources against ``torch/types.h`` instead of ``torch/extension.h`` where
  they include the latter and use nothing of pybind11 (:func:`lighter_cuda_sources`): nvcc parses
  every header three times (host preprocessing and cudafe++, the device front end cicc, the host
  compile), and the extension header adds the whole C++ frontend and pybind11 (the CUDA file of
  one elementwise kernel: nvcc 62 s -> 27 s on the 2-core CPU machine; load_inline itself puts
  ``torch/types.h`` first in the CUDA file, and the bindings live in the C++ file). A source
  that needs the full header fails that build and is built again as written, so the only cost
  of a wrong guess is time;
- turns a failed build into :class:`assay.bench.build.BuildError` whose ``log`` is the whole
  compiler output, so the verdict's ``compiles`` check and the repair prompt get the log even
  when torch's message is longer than the worker's error line.

Builds happen in a private folder under ``TMPDIR`` (the sandbox's scratch); only the finished
library is copied into the cache, under a lock per key, and renamed into place atomically. The
library the process loaded stays at its path in ``TMPDIR`` (:func:`_clear_build_dir`): the
verifier's ``audit_provenance`` reads the candidate's kernels from the scratch folder and the
cache, and a worker that built its own candidate (no prebuild, or a cache it may not write) had
deleted the only copy it loaded; a candidate may also read the module's ``__file__``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from assay.bench.build import BuildError, cache_dir, cache_lock, cuda_arch, nvcc_path

# Arguments that change what is built; the rest (verbosity, where intermediates go) do not.
_NOT_CONTENT = ("build_directory", "verbose", "keep_intermediates")
_ORIGINAL: list[Any] = []


def arch_list(arch: str | None = None) -> str:
    """``sm_90`` -> ``9.0``, ``sm_90a`` -> ``9.0a``: TORCH_CUDA_ARCH_LIST's spelling."""
    a = (arch or cuda_arch()).removeprefix("sm_")
    digits = "".join(ch for ch in a if ch.isdigit())
    suffix = a[len(digits):]
    return f"{digits[:-1]}.{digits[-1]}{suffix}" if len(digits) >= 2 else a


def pin_arch_env() -> None:
    """Build for the verifying device's architecture only (unless the user chose a list)."""
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch_list())


def _compiler_id() -> list[str]:
    return [os.environ.get("CXX", "c++"), nvcc_path() or "", os.environ.get("CUDA_HOME", "")]


def content_key(bound: dict[str, Any]) -> str:
    """The cache key of one load_inline call (its bound arguments) on this machine."""
    import torch

    content = {k: v for k, v in bound.items() if k not in _NOT_CONTENT}
    h = hashlib.sha256()
    h.update(json.dumps(content, sort_keys=True, default=repr).encode())
    h.update(json.dumps([torch.__version__, sys.version, os.environ.get("TORCH_CUDA_ARCH_LIST"),
                         *_compiler_id()]).encode())
    return h.hexdigest()[:24]


def cached_path(key: str) -> Path:
    return cache_dir() / f"inline-{key}.so"


def _import(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ninja_log(message: str) -> str:
    """torch puts the compiler output after 'Error building extension ...: '."""
    return message.split(": ", 1)[1] if message.startswith("Error building extension") \
        and ": " in message else message


def cached_load_inline(*args, **kwargs):
    """``load_inline`` with the content-hash cache (same signature, same return value)."""
    original = _ORIGINAL[0] if _ORIGINAL else _torch_load_inline()
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    if not a.get("is_python_module", True) or a.get("sycl_sources"):
        return original(*args, **kwargs)  # an op library or SYCL: torch's own path
    pin_arch_env()
    name = str(a["name"])
    key = content_key(a)
    lib = cached_path(key)
    if lib.exists():
        return _import(name, lib)
    with cache_lock(lib.with_suffix(".lock")) as shared:
        if shared and lib.exists():  # another worker (or the prebuild) built it meanwhile
            return _import(name, lib)
        build_dir = tempfile.mkdtemp(prefix=f"inline-{key}-")
        built = Path()
        try:
            module = _build(original, a, build_dir, name)
            built = Path(getattr(module, "__file__", "") or "")
            if shared and built.name.split(".")[0] == name and built.is_file():
                # copy beside the final name, then rename: a half-copied library is never seen
                tmp = lib.with_name(f".{lib.name}.{os.getpid()}.tmp")
                shutil.copyfile(built, tmp)
                os.replace(tmp, lib)
            return module
        finally:
            _clear_build_dir(build_dir, built)


def _build(original, a: dict[str, Any], build_dir: str, name: str):
    """torch's load_inline into ``build_dir``: first with the lighter CUDA header where it
    applies, then (that build failing in the CUDA file) the sources as written; a failure of
    the build that counts is a BuildError with its whole log."""
    a = {**a, "build_directory": build_dir}
    light = lighter_cuda_sources(a.get("cuda_sources"))
    if light is not None:
        versions = _torch_build_counts()
        before = versions.get(name)
        try:
            return _load(original, name, {**a, "cuda_sources": light})
        except BuildError as e:
            if "FAILED: cuda.cuda.o" not in e.log:  # the C++ file, which the swap leaves as it
                raise  # was: the same failure again
            print(f"[assay] {name}: the build with torch/types.h in place of torch/extension.h "
                  "failed; building the sources as written", file=sys.stderr, flush=True)
            # torch numbers a name's builds per process (other sources: NAME_v1, whose library
            # the cache's import by NAME cannot load): the failed attempt is forgotten
            if before is None:
                versions.pop(name, None)
            else:
                versions[name] = before
    return _load(original, name, a)


def _load(original, name: str, a: dict[str, Any]):
    """torch's load_inline(**a); its failed build a BuildError whose log is ninja's output."""
    try:
        return original(**a)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        text = str(e)
        if "Error building extension" not in text:
            raise
        raise BuildError(f"load_inline build of {name!r} failed", _ninja_log(text)) from None


def _torch_build_counts() -> dict:
    """torch's per-process count of each extension name's builds (its JIT versioner's entries;
    an empty dict where a torch version keeps none)."""
    from torch.utils import cpp_extension

    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    return entries if isinstance(entries, dict) else {}


_EXTENSION_H = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/extension\.h[>\"][^\n]*$", re.M)
_PYBIND = re.compile(r"\bPYBIND11_|\bpybind11\b|\bpy::|\bPyObject\b|\bTORCH_LIBRARY")


def lighter_cuda_sources(cuda_sources: Any) -> list[str] | None:
    """``cuda_sources`` (a string or a list, as load_inline takes them) with each
    ``#include <torch/extension.h>`` line removed (load_inline puts ``torch/types.h`` first in
    the CUDA file: ATen, the tensor factories, TORCH_CHECK, the dispatch macros), or None where
    there is none to remove or a source uses pybind11, Python's C API or op registration (the
    extension header's own parts)."""
    if not cuda_sources:
        return None
    sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    if not all(isinstance(s, str) for s in sources):
        return None
    if not any(_EXTENSION_H.search(s) for s in sources) or any(_PYBIND.search(s) for s in sources):
        return None
    return [_EXTENSION_H.sub("", s) for s in sources]


def _clear_build_dir(build_dir: str, built: Path) -> None:
    """Remove the build folder, all but the library this process loaded: it stays where the
    module's ``__file__`` says (a candidate may copy or dlopen it, as it may after torch's own
    load_inline), in ``TMPDIR``, the sandbox's scratch folder, where audit_provenance looks for
    the candidate's kernels (and which goes with the worker)."""
    root = Path(build_dir)
    try:
        keep = built.resolve() if built.is_file() and root.resolve() in built.resolve().parents \
            else None
    except OSError:
        keep = None
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
        return
    for entry in root.iterdir():
        if entry.resolve() == keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _torch_load_inline():
    from torch.utils import cpp_extension

    return cpp_extension.load_inline


def install() -> None:
    """Route ``torch.utils.cpp_extension.load_inline`` through the cache in this process
    (before the candidate is imported: ``from ... import load_inline`` then gets ours)."""
    from torch.utils import cpp_extension

    if not _ORIGINAL:
        _ORIGINAL.append(cpp_extension.load_inline)
    cpp_extension.load_inline = cached_load_inline
