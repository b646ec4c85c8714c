"""benchmarks/device_wheels.py: which distributions the GPU machine is sent (no network here:
only the closure over this environment's installed metadata)."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("device_wheels",
                                               REPO / "benchmarks/device_wheels.py")
dw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dw)


def test_closure_follows_requirements_with_the_machines_markers():
    got = dw.closure(("hydra-core",))
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "pyyaml"} <= set(got)
    assert all(v for v in got.values())  # the installed (pinned) versions
    # rich's closure: markdown-it-py and pygments, not its extras (jupyter)
    rich = dw.closure(("rich",))
    assert {"markdown-it-py", "mdurl", "pygments"} <= set(rich) and "ipywidgets" not in rich


def test_what_torch_brings_is_never_sent():
    sent = set(dw.closure(dw.BASE)) - dw.on_the_machine()
    assert "hydra-core" in sent and not sent & {"torch", "numpy", "typing-extensions", "jinja2",
                                                 "filelock", "markupsafe"}


def test_a_missing_distribution_is_a_one_line_error():
    with pytest.raises(SystemExit, match="no-such-dist-here is not installed"):
        dw.closure(("no-such-dist-here",))
