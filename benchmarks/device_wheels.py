"""Fetch the wheels the GPU machine lacks into .whl/ (carried to it by the device tool; the
machine has Python 3.12, torch and Triton but no network):

    python3 benchmarks/device_wheels.py                 # verify, bench, profile, gpu_phases.sh
    python3 benchmarks/device_wheels.py --pipeline      # + snakemake's closure: the DAG there

The distributions and their exact versions are this checkout's virtualenv's (``make install``
pins them): the closure of the roots' requirements (markers for Linux and Python 3.12), less
torch's own closure (a wheel of ours ahead of torch's typing_extensions or jinja2 on PYTHONPATH
could break its import), Triton and numpy. Each is fetched as a CPython 3.12 manylinux
x86_64 or pure wheel; one published only as a source archive is built into a wheel here (pure
Python ones only: a compiled one built here would be for this machine's Python). Prints each
wheel and the total size (the device tool carries 64 MiB a call, the working tree included).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
# what the GPU steps import beyond torch (assay.verify, assay.bench, gpu_phases.sh's phases;
# einops: KernelBench's Mamba2 tasks)
BASE = ("hydra-core", "omegaconf", "psutil", "rich", "filelock", "einops")
PIPELINE = ("snakemake",)
# the GPU machine's torch and what it requires (read from this venv's torch: the same
# requirements), Triton and numpy: never shadowed by ours
ALSO_ON_THE_MACHINE = {"triton", "numpy"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# the GPU machine: Linux x86_64, CPython 3.12
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """Distribution name -> installed version, for the roots and everything they require on the
    GPU machine (requirements with an extra, or whose marker is false there, left out)."""
    found: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = norm(stack.pop())
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"error: {name} is not installed in this environment (run make install)")
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not Marker(str(req.marker)).evaluate(ENV):
                continue
            stack.append(req.name)
    return found


def on_the_machine() -> set[str]:
    """What the GPU machine has: torch's closure and ALSO_ON_THE_MACHINE."""
    return set(closure(("torch",))) | ALSO_ON_THE_MACHINE


def fetch(name: str, version: str, dest: Path) -> Path:
    """One wheel of ``name==version`` for the GPU machine into ``dest``."""
    before = set(dest.iterdir())
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(dest),
           f"{name}=={version}"]
    if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:
        with tempfile.TemporaryDirectory() as tmp:  # a source archive: a pure wheel built here
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--no-binary=:all:", "-d", tmp, f"{name}=={version}"], check=True,
                           capture_output=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(dest), *map(str, Path(tmp).iterdir())], check=True,
                           capture_output=True)
    new = sorted(set(dest.iterdir()) - before)
    if not new:  # already there from an earlier run
        new = sorted(p for p in dest.glob("*.whl") if norm(p.name.split("-")[0]) == name)
    wheel = new[-1]
    if "-none-any" not in wheel.name and "cp312" not in wheel.name and "abi3" not in wheel.name:
        sys.exit(f"error: {wheel.name}: built for this machine's Python, not the GPU machine's")
    return wheel


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--pipeline", action="store_true", help="snakemake and its closure too")
    a.add_argument("--dest", default=str(REPO / ".whl"))
    args = a.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = closure(BASE + (PIPELINE if args.pipeline else ()))
    wanted = {n: v for n, v in wanted.items() if n not in on_the_machine()}
    total = 0
    for i, (name, version) in enumerate(sorted(wanted.items()), 1):
        wheel = fetch(name, version, dest)
        total += wheel.stat().st_size
        print(f"[{i}/{len(wanted)}] {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB)",
              flush=True)
    print(f"{len(wanted)} wheels, {total / 2**20:.1f} MiB in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
