"""Provenance of the kernel audit: each kernel the worker's report credits to the candidate must
be defined in a library built for it, and the harness reads those libraries itself.

The worker's report is written by the process the candidate runs in, so its audit rows can be
forged (``exploit_forged_worker_report``). What the report cannot forge is what lies on disk
after the worker has exited: the shared libraries and cubins the candidate's builds left in the
kernel cache and in its scratch folder. A kernel name that no such artifact defines never ran as
the candidate's own code: either the audit was rewritten, or the kernel belongs to a library
whose name the policy's patterns do not know (a cub or cuDNN kernel). Both are refused.

What this does not prove: that a kernel an artifact defines actually ran. A candidate that
builds a decoy kernel and names it in a forged audit passes this check; see
docs/ARCHITECTURE.md ("What the worker's report can prove").

Artifacts: every ELF file (shared library, cubin) in the scratch folder (Triton's cache, torch
extensions, a private kernel cache), and the kernel-cache libraries the worker reports it had
mapped (the shared cache holds every candidate's builds; only those are read). A reported path
outside the kernel cache or the scratch folder is ignored, so a forged list can only point at
libraries that exist where builds go. Pure functions of bytes and paths: no torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ELF_MAGIC = b"\x7fELF"
MAX_FILES = 4000  # the scratch folder is the candidate's: a flood of files is not read
MAX_REPORTED = 256  # nor more reported libraries than a process maps
MAX_BYTES = 512 << 20  # nor a file larger than any kernel library
MAX_TOTAL_BYTES = 2 << 30  # the harness reads at most this much per verdict
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def kernel_identifier(name: str) -> str | None:
    """The kernel's own identifier in a profiler name (demangled by the profiler):
    ``void ns::tile_kernel<128>(float*)`` -> ``tile_kernel``; ``gelu`` -> ``gelu``.
    None when the name holds no identifier (nothing an artifact could be searched for)."""
    s = name.replace("(anonymous namespace)", "")
    kept, depth = [], 0
    for ch in s:  # template arguments out (nested ones too)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    head = "".join(kept).split("(", 1)[0]  # the parameter list out
    words = head.split("::")[-1].split()  # the namespace, then the return type, out
    ident = words[-1] if words else ""
    return ident if _IDENT.fullmatch(ident) else None


_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$")


def defines(data: bytes, ident: str) -> bool:
    """Whether an artifact's bytes name the kernel ``ident``: as a plain symbol (extern "C",
    Triton) or as a source name inside an Itanium-mangled one (``_Z11gelu_kernelPKfPfl``: its
    length, then the name). nvcc keeps the mangled names uncompressed beside the fatbin."""
    raw = ident.encode()
    size = str(len(raw)).encode()
    i = data.find(raw)
    while i >= 0:
        j = i + len(raw)
        if (i == 0 or data[i - 1] not in _WORD) and (j == len(data) or data[j] not in _WORD):
            return True
        if i >= len(size) and data[i - len(size):i] == size:  # (after _GLOBAL__N_1 too)
            return True
        i = data.find(raw, i + 1)
    return False


def _is_elf(path: Path) -> bool:
    try:
        st = path.lstat()
        if not path.is_file() or path.is_symlink() or st.st_size > MAX_BYTES:
            return False
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def artifacts(scratch: Path, cache: Path | None, reported: Iterable[Any]) -> list[Path]:
    """The ELF files built for this candidate: the reported paths that are ELF files in
    ``cache`` (or ``scratch``; at most MAX_REPORTED looked at), then every one under
    ``scratch`` (at most MAX_FILES files looked at)."""
    found: dict[str, Path] = {}
    for item in list(reported)[:MAX_REPORTED]:
        if not isinstance(item, str) or not item.startswith("/"):
            continue
        p = Path(item)
        if ((cache is not None and _inside(p, cache)) or _inside(p, scratch)) and _is_elf(p):
            found.setdefault(str(p.resolve()), p.resolve())
    seen = 0
    for root, dirs, files in os.walk(scratch, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if seen > MAX_FILES:
                return list(found.values())
            p = Path(root) / name
            if _is_elf(p):
                found.setdefault(str(p.resolve()), p.resolve())
    return list(found.values())


def credited(rows: list[dict[str, Any]],
             library: re.Pattern[str] | Callable[[str], bool]) -> list[str]:
    """The kernels the kernel audit counts as the candidate's own: device kernels that ran
    (device time > 0) and that ``library`` (the policy's patterns, or its predicate with the
    candidate's own Triton kernels, policy.is_library) does not call a library's."""
    is_lib = library.search if isinstance(library, re.Pattern) else library
    return sorted({r["name"] for r in rows if r.get("kind") == "kernel"
                   and float(r.get("device_us") or 0) > 0 and isinstance(r.get("name"), str)
                   and not is_lib(r["name"])})


def proven(names: list[str], files: list[Path]) -> tuple[bool, str]:
    """Every credited kernel name defined by one of ``files`` (read one at a time, in order,
    at most MAX_TOTAL_BYTES in all): (passed, detail)."""
    if not names:
        return True, "no kernel credited to the candidate"
    idents = {name: kernel_identifier(name) for name in names}
    where: dict[str, str] = {}
    read = total = 0
    for p in files:
        if len(where) == len(names) or total >= MAX_TOTAL_BYTES:
            break
        try:
            data = p.read_bytes()
        except OSError:
            continue
        read, total = read + 1, total + len(data)
        for name, ident in idents.items():
            if name not in where and ident and defines(data, ident):
                where[name] = p.name
    missing = [n for n in names if n not in where]
    if missing:
        return False, (f"the audit credits the candidate with {len(missing)} kernel(s) that no "
                       f"library built for it defines ({read} read): "
                       f"{', '.join(m[:80] for m in missing[:4])}; a forged report, or a "
                       f"library's kernel the policy's patterns do not know")
    libs = sorted(set(where.values()))
    return True, (f"{len(names)} credited kernel(s), each defined in the candidate's build "
                  f"({', '.join(libs[:4])})")
