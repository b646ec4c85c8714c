"""The config's schema: every key typed, choice fields as Enums, a bad config failing at start in
one line naming the key and the allowed values; permissive inheriting strict; one source for
defaults; every ASSAY_* variable the code reads documented in assay.env and the README."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml

from assay import env as assay_env
from assay.app import ConfigError, compose
from assay.propose.llm import LiteLLMProposer
from assay.resources import config_dir
from assay.schemas import AssayConfig, LLMConfig, TargetName, TaskSize, Toggle
from assay.verify.settings import OnDegenerate, Policy, Transfer
from helpers import REPO, env

SRC = REPO / "src" / "assay"

# Names that look like variables but are not environment variables.
NOT_VARIABLES = {"ASSAY_SIZES", "ASSAY_FN", "ASSAY_LIBMVEC"}  # names in code, not the environment


def test_every_top_level_key_of_the_config_is_in_the_root_schema():
    cfg = compose([])
    assert set(cfg.keys()) == {f.name for f in fields(AssayConfig)}
    raw = yaml.safe_load((config_dir() / "config.yaml").read_text())
    assert set(raw) - {"defaults", "hydra"} <= {f.name for f in fields(AssayConfig)}


@pytest.mark.parametrize("override, key, allowed", [
    ("verify.policy=lenient", "verify.policy", [p.value for p in Policy]),
    ("verify.transfer=gpu", "verify.transfer", [t.value for t in Transfer]),
    ("verify.on_degenerate=warn", "verify.on_degenerate", [o.value for o in OnDegenerate]),
    ("verify.input_distributions=[native,huge]", "verify.input_distributions",
     ["native", "large", "small", "offset"]),
    ("target.name=gpu", "target.name", [t.value for t in TargetName]),
    ("tasks.size=huge", "tasks.size", [s.value for s in TaskSize]),
    ("profile.ncu=maybe", "profile.ncu", [t.value for t in Toggle]),
    ("llm.kind=openai", "llm.kind", ["offline", "litellm"]),
])
def test_a_bad_choice_fails_at_compose_naming_the_key_and_the_values(override, key, allowed):
    with pytest.raises(ConfigError) as e:
        compose([override])
    line = str(e.value)
    assert "\n" not in line and key in line, line
    assert all(v in line for v in allowed), line


def test_an_unknown_key_and_a_wrong_type_fail_in_one_line():
    for override, key in (("bogus=1", "bogus"), ("evolve.generations=two", "evolve.generations"),
                          ("verify.limits.memroy_gb=4", "verify.limits.memroy_gb")):
        with pytest.raises(ConfigError) as e:
            compose([override])
        assert "\n" not in str(e.value) and key in str(e.value), str(e.value)


def test_a_bad_value_in_a_config_file_fails_too(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(config_dir(), tmp_path / "config")
    strict = tmp_path / "config" / "verify" / "strict.yaml"
    text = strict.read_text()
    assert "\ntransfer: draw" in text
    strict.write_text(text.replace("\ntransfer: draw", "\ntransfer: pcie"))
    monkeypatch.setenv(assay_env.CONFIG_DIR.name, str(tmp_path / "config"))
    with pytest.raises(ConfigError) as e:
        compose([])
    assert "verify.transfer" in str(e.value) and "cuda_ipc" in str(e.value)


def test_a_step_exits_2_with_one_line_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "assay.steps.extract", "task=L1_1_ReLU",
                        f"results_dir={tmp_path}", "verify.policy=lenient"],
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config "), r.stderr
    assert "verify.policy" in lines[0] and "strict, permissive" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_missing_group_option_lists_the_options():
    with pytest.raises(ConfigError) as e:
        compose(["llm=nope"])
    assert "llm/nope" in str(e.value) and "openai" in str(e.value) and "\n" not in str(e.value)


def test_permissive_inherits_strict_and_changes_only_the_policy():
    strict = compose(["verify=strict"]).verify
    permissive = compose(["verify=permissive"]).verify
    assert strict.policy == Policy.strict and permissive.policy == Policy.permissive
    assert strict.max_library_time_frac == 0.0 and permissive.max_library_time_frac == 1.0
    differ = {k for k in strict if strict[k] != permissive[k]}
    assert differ == {"policy", "max_library_time_frac"}
    text = (config_dir() / "verify" / "permissive.yaml").read_text()
    assert "- strict" in text and len(yaml.safe_load(text)) <= 3


def test_choices_read_as_plain_strings():
    """StrEnum: code comparing with strings and f-strings keep working."""
    cfg = compose([])
    assert cfg.verify.policy == "strict" and f"{cfg.verify.policy}" == "strict"
    assert cfg.verify.input_distributions[0] == "native"


def test_the_llm_defaults_come_from_the_schema_alone():
    p = LiteLLMProposer(model="openai/x")
    for name in ("temperature", "max_tokens", "timeout_s", "max_retries", "send_seed",
                 "concurrency"):
        assert getattr(p, name) == getattr(LLMConfig, name), name
    cfg = compose(["llm=openai"])
    from assay.propose import make_proposer

    made = make_proposer(cfg, "cpu")
    assert made.timeout_s == cfg.llm.timeout_s
    assert made.max_stepping_stones == cfg.evolve.stepping_stones


def test_every_group_file_starts_from_a_schema():
    for path in sorted(config_dir().glob("*/*.yaml")):
        if path.name == "workflow.yaml" or path.parent.name == "config":
            continue
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
        assert defaults and defaults[0] in ("schema", "strict", "default"), path


def test_the_root_and_every_group_schema_are_registered():
    from hydra.core.config_store import ConfigStore

    from assay.schemas import ROOT

    repo = ConfigStore.instance().repo
    assert f"{ROOT}.yaml" in repo
    for group in ("llm", "tasks", "evolve", "verify", "target", "profile"):
        assert "schema.yaml" in repo[group], group


def test_every_assay_variable_read_under_src_is_documented():
    declared = {v.name for v in assay_env.ALL}
    used = set()
    for path in SRC.rglob("*.py"):
        used |= set(re.findall(r"\bASSAY_[A-Z_]+\b", path.read_text()))
    used |= set(re.findall(r"\bASSAY_[A-Z_]+\b", (REPO / "workflow" / "profiles" / "slurm" /
                                                   "config.yaml").read_text()))
    assert used - NOT_VARIABLES - declared == set(), "document these in assay/env.py"
    assert declared - used == set(), "no longer read anywhere: drop them from assay/env.py"
    readme = (REPO / "README.md").read_text()
    assert assay_env.markdown_table() in readme, "README's table: assay.env.markdown_table()"


def test_compose_works_inside_a_running_step(tmp_path):
    """The export step composes a policy's settings while Hydra runs the step itself."""
    code = ("from assay import app\n"
            "def fn(cfg):\n"
            "    print(app.compose(['verify=permissive']).verify.policy, cfg.verify.policy)\n"
            "app.step(fn)()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(),
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["permissive", "strict"], r.stderr[-2000:]


def test_compose_ignores_a_hydra_left_initialized_on_another_config_folder(tmp_path):
    """An in-process Hydra app that returned leaves Hydra initialized (in CI, on a test's own
    config folder): compose outside a step must still read the project's config."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "config.yaml").write_text("other: 1\n")
    ctx = initialize_config_dir(version_base="1.3", config_dir=str(tmp_path))
    ctx.__enter__()  # left initialized, as a returned app leaves it
    try:
        assert compose(["verify=strict"]).verify.policy == "strict"
    finally:
        GlobalHydra.instance().clear()


def test_the_triton_target_runs_on_the_machines_device_and_writes_triton(monkeypatch):
    """``target=triton``: the kernels are Triton's on either device; the device is cuda with a
    GPU, else cpu (Triton's interpreter), as for ``target=auto``; the other targets write their
    device's own language."""
    import assay.gpu
    from assay.app import kernel_target, target

    cfg = compose(["target=triton"])
    assert cfg.target.name == TargetName.triton
    for gpus, device in (([], "cpu"), ([0], "cuda")):
        monkeypatch.setattr(assay.gpu, "visible_gpus", lambda g=gpus: g)
        assert (target(cfg), kernel_target(cfg)) == (device, "triton")
        auto = compose([])
        assert (target(auto), kernel_target(auto)) == (device, device)
    for name in ("cpu", "cuda"):
        fixed = compose([f"target={name}"])
        assert (target(fixed), kernel_target(fixed)) == (name, name)
