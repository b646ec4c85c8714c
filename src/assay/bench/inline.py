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
- builds light first (:func:`light_sources`): load_inline puts ``torch/extension.h`` (the C++
  frontend, pybind11, all of ATen) first in the binding file and ``torch/types.h`` (all of
  ATen) first in the CUDA file, and the compilers spend most of a cold build parsing them
  (nvcc three times: host preprocessing and cudafe++, the device front end cicc, the host
  compile). The light build starts each file with ATen's core and the per-operator headers of
  the functions its sources call, those without the two headers their inline functions never
  use (:func:`write_slim_op_headers`), and the binding file also with pybind11 and torch's
  Tensor caster: on the 2-core CPU machine a KernelBench-style elementwise candidate's CUDA
  file compiled in 8.1-8.5 s instead of 25.4 s and its binding file in 5.0 s instead of 16.8 s. A
  source that needs more fails that build and is built again (:func:`_build`), so the only
  cost of a wrong guess is the light build's time;
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

import functools
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
    """torch's load_inline into ``build_dir``, lightest first (:func:`light_sources`): both
    files light; the CUDA file failing, the light binding file (compiled already: ninja keeps
    it) with the CUDA file exactly as load_inline writes it, whose failure is the candidate's
    own; the binding file failing, the sources as written. The failure that counts is a
    BuildError with its whole log."""
    a = {**a, "build_directory": build_dir}
    light = light_sources(a, Path(build_dir) / "light_include")
    if light is not None:
        try:
            return _attempt(original, name, {**a, **light})
        except BuildError as e:
            binding_failed = _FAILED_BINDING in e.log
        if not binding_failed and a.get("cuda_sources"):
            _say(name, "the CUDA file needs more than ATen's core: compiling it as load_inline "
                       "writes it (the light binding file kept)")
            try:
                return _attempt(original, name, {**a, **light,
                                                 "cuda_sources": as_load_inline_writes(a)})
            except BuildError as e:
                if _FAILED_BINDING not in e.log:
                    raise
        _say(name, "the light binding file failed: building the sources as written")
    return _load(original, name, a)


# ninja's line for torch's binding object (the CUDA object is cuda.cuda.o)
_FAILED_BINDING = "FAILED: main.o"


def _say(name: str, what: str) -> None:
    print(f"[assay] {name}: {what}", file=sys.stderr, flush=True)


def _attempt(original, name: str, a: dict[str, Any]):
    """One of several builds of a name: a failed one is forgotten by torch's versioner, which
    numbers a name's builds per process (other sources: NAME_v1, whose library the cache's
    import by NAME cannot load)."""
    versions = _torch_build_counts()
    before = versions.get(name)
    try:
        return _load(original, name, a)
    except BuildError:
        if before is None:
            versions.pop(name, None)
        else:
            versions[name] = before
        raise


def as_load_inline_writes(a: dict[str, Any]) -> list[str]:
    """The CUDA sources with the headers load_inline itself puts first (without
    ``no_implicit_headers``)."""
    cuda = a["cuda_sources"]
    return ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>",
            *([cuda] if isinstance(cuda, str) else cuda)]


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


# The whole-torch headers a light build leaves out: load_inline's implicit ones and a source's
# own include of the same (torch/extension.h is the C++ frontend, pybind11 and all of ATen)
_WHOLE_TORCH_H = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/(?:extension|torch|types|all)\.h[>\"][^\n]*$", re.M)
# What only the whole headers declare: a source naming these is built as written at once
_FRONTEND = re.compile(r"\btorch::(?:nn|jit|autograd|optim|data|serialize|tensor|from_blob|"
                       r"Library|library)\b|\bTORCH_LIBRARY|\bTORCH_MODULE")
# CUDA sources keep the whole headers where they use pybind11 or Python's C API: the binding
# file has them in a light build, the CUDA file would not
_PYBIND = re.compile(r"\bPYBIND11_|\bpybind11\b|\bpy::|\bPyObject\b")
# An ATen function called through torch:: or at:: (a template argument list allowed)
_CALL = re.compile(r"\b(?:torch|at)::(\w+)\s*(?:<[^<>;]*>\s*)?\(")
# Names ATen.h brings beyond the core and its per-operator headers: the header to add for each
_NAMED = ((re.compile(r"\bAT_DISPATCH_"), "ATen/Dispatch.h"),
          (re.compile(r"\bat::parallel_for\b|\bat::get_num_threads\b"), "ATen/Parallel.h"),
          (re.compile(r"\bglobalContext\b"), "ATen/Context.h"),
          (re.compile(r"\bacc_type\b"), "ATen/AccumulateType.h"))
# The dtype constants torch:: spells apart from at:: (torch/types.h declares them)
_TORCH_DTYPES = {"kUInt8": "kByte", "kInt8": "kChar", "kInt16": "kShort", "kInt32": "kInt",
                 "kInt64": "kLong", "kFloat16": "kHalf", "kFloat32": "kFloat",
                 "kFloat64": "kDouble", "kU8": "kByte", "kI8": "kChar", "kI16": "kShort",
                 "kI32": "kInt", "kI64": "kLong", "kF16": "kHalf", "kF32": "kFloat",
                 "kF64": "kDouble"}


@functools.cache  # (each file's preamble and the slim headers look the same ops up)
def _op_header(op: str) -> Path | None:
    """ATen's per-operator header for ``op`` (``ATen/ops/<op>.h``) where torch ships one."""
    from torch.utils.cpp_extension import include_paths

    for root in include_paths():
        if (path := Path(root) / "ATen" / "ops" / f"{op}.h").is_file():
            return path
    return None


def ops_called(sources: list[str]) -> dict[str, Path]:
    """{op: its per-operator header} for every ATen function the sources call through
    ``torch::`` or ``at::``."""
    return {op: h for op in sorted(set(_CALL.findall("\n".join(sources))))
            if (h := _op_header(op)) is not None}


# What a per-operator header includes and its inline functions never use: half of a light
# file's parse (g++ -fsyntax-only, ATen's core and one operator: 3.3 s with them, 1.4 s without)
_UNUSED_BY_OP_HEADERS = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<ATen/(?:Context|DeviceGuard)\.h>"
                                   r"[^\n]*$", re.M)


def write_slim_op_headers(ops: dict[str, Path], include_dir: Path) -> None:
    """Copies of the installed per-operator headers, without the two headers their inline
    functions (each a call of ``at::_ops::<op>::call``) never use, under ``include_dir``
    (searched before torch's own: ``-I`` before ``-isystem``). Made from the user's torch at
    build time, in the build's private folder."""
    out = include_dir / "ATen" / "ops"
    out.mkdir(parents=True, exist_ok=True)
    for op, header in ops.items():
        (out / f"{op}.h").write_text(_UNUSED_BY_OP_HEADERS.sub("", header.read_text()))


def light_preamble(sources: list[str]) -> list[str]:
    """The lines a light file starts with: ATen's core (the Tensor class and its methods,
    TORCH_CHECK, the scalar types), the per-operator header of every ATen function the
    sources call, the few other ATen headers they name, the tensor arithmetic operators, and
    ``torch::`` as an alias of ``at::`` (what torch/types.h makes of it), with the dtype names
    torch:: spells apart."""
    text = "\n".join(sources)
    heads = ["ATen/core/Tensor.h"]
    heads += [f"ATen/ops/{op}.h" for op in ops_called(sources)]
    heads += [h for pattern, h in _NAMED if pattern.search(text)]
    aliases = [f"constexpr auto {k} = at::{v};" for k, v in _TORCH_DTYPES.items()
               if re.search(rf"\btorch::{k}\b", text)]
    if re.search(r"\btorch::Dtype\b", text):
        aliases.append("using Dtype = at::ScalarType;")
    return [*(f"#include <{h}>" for h in heads), *_TENSOR_OPERATORS,
            "namespace torch { using namespace at; " + " ".join(aliases) + " }"]


# Tensor arithmetic (x * 2 + y): ATen's operators header, in the per-operator form torch builds
# itself with (it then needs empty_like only, the operators calling Tensor methods), where
# whole-ATen mode would include every function of ATen
_TENSOR_OPERATORS = ["#ifndef AT_PER_OPERATOR_HEADERS", "#define AT_PER_OPERATOR_HEADERS",
                     "#include <ATen/TensorOperators.h>", "#undef AT_PER_OPERATOR_HEADERS",
                     "#else", "#include <ATen/TensorOperators.h>", "#endif"]
_OPERATORS_NEED = "empty_like"


def light_sources(a: dict[str, Any], include_dir: Path | None = None) -> dict[str, Any] | None:
    """load_inline's arguments for a light build, or None where it does not apply; with
    ``include_dir``, the slim per-operator headers written there and searched first
    (:func:`write_slim_op_headers`).

    load_inline puts ``torch/extension.h`` first in the C++ (binding) file and
    ``torch/types.h`` first in the CUDA file, and sources usually include the former again;
    the compilers spend most of a cold build parsing them (nvcc three times). A light build
    passes ``no_implicit_headers`` and starts each file with what it needs instead: the binding
    file pybind11 with torch's Tensor caster and error wrapper (``torch/csrc/utils/pybind.h``,
    ``torch/csrc/Exceptions.h``), the CUDA file ``cuda.h`` and ``cuda_runtime.h`` (load_inline's
    own), both :func:`light_preamble`; each source's own include of a whole-torch header is
    taken out. Not for sources that name the C++ frontend (modules, autograd, op registration,
    ``torch::tensor``), CUDA sources that use pybind11 or Python's C API, non-string sources, or
    where the caller already chose the headers."""
    if a.get("no_implicit_headers") or "no_implicit_headers" not in a:
        return None  # the caller's own choice, or a torch without the switch
    cpp, cuda = a.get("cpp_sources"), a.get("cuda_sources") or []
    cpp = [cpp] if isinstance(cpp, str) else list(cpp or [])
    cuda = [cuda] if isinstance(cuda, str) else list(cuda)
    if not all(isinstance(s, str) for s in cpp + cuda):
        return None
    if any(_FRONTEND.search(s) for s in cpp + cuda) or any(_PYBIND.search(s) for s in cuda):
        return None
    cpp = [_WHOLE_TORCH_H.sub("", s) for s in cpp]
    cuda = [_WHOLE_TORCH_H.sub("", s) for s in cuda]
    binding = ["#include <torch/csrc/utils/pybind.h>", "#include <torch/csrc/Exceptions.h>"]
    out = {"cpp_sources": [*binding, *light_preamble(cpp), *cpp], "no_implicit_headers": True}
    if cuda:
        out["cuda_sources"] = ["#include <cuda.h>", "#include <cuda_runtime.h>",
                               *light_preamble(cuda), *cuda]
    ops = ops_called(cpp + cuda)
    if (operators_need := _op_header(_OPERATORS_NEED)) is not None:
        ops.setdefault(_OPERATORS_NEED, operators_need)
    if include_dir is not None:
        write_slim_op_headers(ops, include_dir)
        out["extra_include_paths"] = [str(include_dir), *(a.get("extra_include_paths") or [])]
    return out


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
