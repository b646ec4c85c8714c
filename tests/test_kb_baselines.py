"""benchmarks/kb_baselines.py: our eager timings against KernelBench's published ones (no
device: rows and published times written here)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("kb_baselines", REPO / "benchmarks/kb_baselines.py")
kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kb)


def _row(task: str, path: str, ms: float, accepted: bool = True, gpu: str | None = None) -> dict:
    r = {"task": task, "path": f".kb/{path}", "accepted": accepted, "runtime_ms": ms}
    return {**r, "gpu": gpu} if gpu else r


@pytest.fixture
def published(tmp_path):
    d = tmp_path / "H100_Modal"
    d.mkdir()
    times = {"level1": {"1_Square_matrix_multiplication_.py": {"mean": 2.0, "hardware": "H100"},
                        "54_conv_standard_3D.py": {"mean": 1.0, "hardware": "H100"},
                        "19_ReLU.py": {"mean": 4.0, "hardware": "H100"}},
             "level2": {}, "level3": {}}
    (d / "baseline_time_torch.json").write_text(json.dumps(times))
    return d


def test_ratios_per_gpu_and_kind_latest_row_wins(tmp_path, published, capsys):
    old = tmp_path / "old.jsonl"
    new = tmp_path / "new.jsonl"
    old.write_text("\n".join(json.dumps(r) for r in [
        _row("L1_1_Square_matrix_multiplication", "level1/1_Square_matrix_multiplication_.py", 9.0),
        _row("L1_54_conv_standard_3D", "level1/54_conv_standard_3D.py", 1.7)]) + "\n\n")
    new.write_text("\n".join(json.dumps(r) for r in [
        _row("L1_1_Square_matrix_multiplication", "level1/1_Square_matrix_multiplication_.py",
             2.1, gpu="H100"),  # replaces the old row of that task, and names its GPU
        _row("L1_19_ReLU", "level1/19_ReLU.py", 3.0),
        _row("L1_20_LeakyReLU", "level1/20_LeakyReLU.py", 1.0),  # nothing published: left out
        _row("L1_21_Sigmoid", "level1/21_Sigmoid.py", 1.0, accepted=False)]) + "\n")
    out = tmp_path / "out"
    assert kb.main(["--timing", str(published), "--rows", str(old), str(new),
                    "--gpu-of", f"{old}=H200", f"{new}=H200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "H100: 1 of 1 tasks within 10%" in text  # 2.1 against 2.0
    assert "H200: 0 of 2 tasks within 10%" in text  # the conv 1.7x slower, the ReLU 0.75x
    assert "convolution: 1 tasks, median 1.700, 1 slower and 0 faster" in text
    assert "memory-bound: 1 tasks, median 0.750, 0 slower and 1 faster" in text
    table = (out / "baselines.md").read_text()
    assert table.count("| L1_") == 3 and "L1_20" not in table and "L1_21" not in table
    # a row timed under PyTorch's default numerics too (the self-check does so for cuDNN
    # tasks): that time is the one compared with the published, as KernelBench timed it
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps({**_row("L1_54_conv_standard_3D", "level1/54_conv_standard_3D.py",
                                        1.7, gpu="H200"), "eager_default_ms": 1.02}) + "\n")
    assert kb.main(["--timing", str(published), "--rows", str(again), "--out", str(out)]) == 0
    assert "convolution: 1 tasks, median 1.020, 0 slower" in capsys.readouterr().out
    assert "| default (cuDNN TF32) |" in (out / "baselines.md").read_text()


def test_bad_input_is_one_line_naming_the_file(tmp_path, published):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"task": "L1_1"}\nnot json\n')
    with pytest.raises(SystemExit, match=r"rows\.jsonl:2: not a JSON row"):
        kb.main(["--timing", str(published), "--rows", str(bad)])
    assert kb.main(["--timing", str(tmp_path / "nowhere"), "--rows", str(bad)]) == 2


def test_a_campaigns_eager_and_compile_baselines_matched_by_level_and_number(
        tmp_path, published, capsys):
    (published / "baseline_time_torch_compile_inductor_default.json").write_text(json.dumps(
        {"level1": {"1_Square_matrix_multiplication_.py": {"mean": 2.0, "hardware": "H100"},
                    "19_ReLU.py": {"mean": 2.0, "hardware": "H100"},
                    "54_conv_standard_3D.py": {"mean": 2.0, "hardware": "H100"}}}))
    camp = tmp_path / "results" / "kb"
    (camp / "baselines").mkdir(parents=True)
    (camp / "device.json").write_text(json.dumps({"name": "NVIDIA H200"}))
    for task, b in {"L1_1_Square_matrix_multiplication": {"eager_ms": 2.05, "compile_ms": 2.5},
                    "L1_19_ReLU": {"eager_ms": 9.0, "eager_default_ms": None, "compile_ms": 1.9},
                    "L1_54_conv_standard_3D": {"eager_ms": 1.7, "eager_default_ms": 1.05,
                                               "compile_ms": 3.0, "compile_default_ms": 2.1}
                    }.items():
        (camp / "baselines" / f"{task}.json").write_text(json.dumps({"task": task, **b}))
    rows = tmp_path / "selfcheck.jsonl"  # the campaign's L1_19 wins over this row
    rows.write_text(json.dumps(_row("L1_19_ReLU", "level1/19_ReLU.py", 4.0, gpu="H200")) + "\n")
    out = tmp_path / "out"
    assert kb.main(["--timing", str(published), "--rows", str(rows), "--campaign", str(camp),
                    "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # eager: the matmul 2.05 / 2.0 (the file's trailing underscore matched by its number), the
    # conv under default numerics 1.05 / 1.0, the ReLU 9.0 / 4.0
    assert "NVIDIA H200: 2 of 3 tasks within 10% of the published eager time" in text, text
    # torch.compile: the conv under default numerics 2.1 / 2.0 (its fp32 3.0 is not compared)
    assert "NVIDIA H200: 2 of 3 tasks within 10% of the published torch.compile time" in text
    table = (out / "baselines.md").read_text()
    assert "| L1_19_ReLU | eager | NVIDIA H200 | 9 | fp32 | 4 | 2.250 |" in table, table
    assert "| L1_54_conv_standard_3D | eager | NVIDIA H200 | 1.05 | default (cuDNN TF32) |" in table
    assert "| L1_54_conv_standard_3D | torch.compile | NVIDIA H200 | 2.1 | default (cuDNN TF32) |" \
        in table, table
    assert "| L1_19_ReLU | torch.compile | NVIDIA H200 | 1.9 | fp32 |" in table, table
    with pytest.raises(SystemExit, match="no baselines/ folder"):
        kb.main(["--timing", str(published), "--campaign", str(tmp_path)])
    # a campaign resumed on an H100: a baseline that names its GPU is that GPU's
    matmul = camp / "baselines" / "L1_1_Square_matrix_multiplication.json"
    matmul.write_text(json.dumps({**json.loads(matmul.read_text()),
                                  "device_name": "NVIDIA H100 80GB HBM3"}))
    assert kb.main(["--timing", str(published), "--campaign", str(camp)]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3: 1 of 1 tasks within 10% of the published eager time" in text
    assert "NVIDIA H200: 1 of 2 tasks within 10% of the published eager time" in text, text


def test_what_a_task_computes_is_read_from_its_level_and_name():
    assert kb.kind("L3_44_MiniGPTBlock") == "model block (level 3)"
    assert kb.kind("L1_88_MinGPTNewGelu") == "memory-bound"  # an elementwise GELU
    assert kb.kind("L1_97_ScaledDotProductAttention") == "matrix product"
    assert kb.kind("L3_1_MLP") == "matrix product"
    assert kb.kind("L3_10_ResNet101") == kb.kind("L1_50_conv_standard_2D") == "convolution"


def test_a_baseline_cache_gives_each_gpu_its_own_comparison(tmp_path, published, capsys):
    """``--cache``: the verify step's baselines of its own GPU (those naming it), compared
    beside the campaign's baseline of the same task on another GPU; a record, a shapes file, an
    unnamed or untimed baseline are not read."""
    camp = tmp_path / "results" / "kb"
    (camp / "baselines").mkdir(parents=True)
    (camp / "device.json").write_text(json.dumps({"name": "NVIDIA H200"}))
    (camp / "baselines" / "L1_19_ReLU.json").write_text(json.dumps({"eager_ms": 3.0}))
    cache = tmp_path / "baseline-cache"
    cache.mkdir()
    key = "0123456789abcdef0123"
    files = {f"L1_19_ReLU-{key}.json": {"eager_ms": 4.1, "device_name": "NVIDIA H100"},
             f"L1_1_Square_matrix_multiplication-{key}.json": {"eager_ms": 2.0},  # unnamed
             f"L1_54_conv_standard_3D-record-{key}.json": {
                 "eager_ms": 9.0, "device_name": "NVIDIA H100"},
             f"L1_54_conv_standard_3D-{key}.json": {"device_name": "NVIDIA H100"}}
    for name, body in files.items():
        (cache / name).write_text(json.dumps(body))
    assert kb.main(["--timing", str(published), "--campaign", str(camp), "--cache",
                    str(cache)]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA H100: 1 of 1 tasks within 10% of the published eager time" in text, text
    assert "NVIDIA H200: 0 of 1 tasks within 10% of the published eager time" in text, text
    (cache / f"L1_19_ReLU-{key}.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"L1_19_ReLU-0123456789abcdef0123\.json: not JSON"):
        kb.main(["--timing", str(published), "--cache", str(cache)])
