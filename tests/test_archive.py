"""collect() and the archive export (parquet per level, Sakana schema + ours)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from assay.archive.export import ARCHIVE_COLUMNS, ARCHIVE_SCHEMA, export, export_campaign, main
from assay.collect import COLLECT_SCHEMA, collect
from assay.layout import Campaign, read_json

try:
    from fake_results import add_candidate, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.fake_results import add_candidate, make_fake_campaign, write_task

SAKANA = ["Op_Name", "Level_ID", "Task_ID", "Kernel_Name", "CUDA_Runtime",
          "PyTorch_Native_Runtime", "PyTorch_Compile_Runtime", "CUDA_Speedup_Native",
          "CUDA_Speedup_Compile", "CUDA_Code", "PyTorch_Code_Module", "PyTorch_Code_Functional",
          "Correct", "Max_Diff", "Error", "NCU_Profile", "Torch_Profile", "Clang_Tidy"]
OURS = ["Verdict_Reasons", "Candidate_ID", "Parent_IDs", "Generation", "LLM", "Tokens",
        "Cost_USD"]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    return make_fake_campaign(tmp_path_factory.mktemp("results"))


def test_columns_constant_is_the_sakana_schema_then_ours() -> None:
    assert ARCHIVE_COLUMNS == SAKANA + OURS
    assert list(ARCHIVE_SCHEMA) == ARCHIVE_COLUMNS


def test_collect_one_row_per_verified_candidate(campaign: Campaign) -> None:
    df = collect(campaign)
    assert dict(df.schema) == COLLECT_SCHEMA
    # 2 llms x 3 tasks x 2 gens x 3 verified candidates; declined and pending left out
    assert df.height == 36
    assert df["candidate"].n_unique() == 36
    for row in df.iter_rows(named=True):
        assert campaign.verdict(row["llm"], row["task"], row["generation"],
                                row["candidate"]).exists()
    proposals = read_json(campaign.proposals("offline", "L1_1_ReLU", 0))
    assert len(proposals["declined"]) == 1
    pending = [c for c in proposals["candidates"]
               if not campaign.verdict("offline", "L1_1_ReLU", 0, c).exists()]
    assert len(pending) == 1 and pending[0] not in df["candidate"].to_list()
    # filters
    one = collect(campaign, llm="offline", task="L1_1_ReLU")
    assert one.height == 6 and set(one["task"]) == {"L1_1_ReLU"}


def test_collect_missing_campaign_is_empty(tmp_path: Path) -> None:
    df = collect(Campaign(tmp_path / "nope"))
    assert df.is_empty() and dict(df.schema) == COLLECT_SCHEMA


def test_export_per_level_files(campaign: Campaign) -> None:
    paths = export(campaign)
    assert [p.name for p in paths] == ["level_1.parquet", "level_2.parquet"]
    counts = {}
    for path in paths:
        df = pl.read_parquet(path)
        assert df.columns == ARCHIVE_COLUMNS
        assert dict(df.schema) == ARCHIVE_SCHEMA
        counts[path.name] = df.height
        assert set(df["Level_ID"]) == {int(path.stem.split("_")[1])}
    # level 1: tasks 0 and 2; level 2: task 1 (2 llms x 2 gens x 3 candidates each)
    assert counts == {"level_1.parquet": 24, "level_2.parquet": 12}
    assert not list(campaign.archive_dir().glob("*.tmp"))
    assert not list(campaign.archive_dir().glob(".*"))


def test_export_values_match_the_tree(campaign: Campaign) -> None:
    df = pl.concat([pl.read_parquet(p) for p in export(campaign)])
    n_correct = 0
    for row in df.iter_rows(named=True):
        task = f"L{row['Level_ID']}_{row['Task_ID']}_{row['Op_Name']}"
        cid = row["Kernel_Name"]
        assert row["Candidate_ID"] == cid
        v = read_json(campaign.verdict(row["LLM"], task, row["Generation"], cid))
        meta = read_json(campaign.proposal_meta(row["LLM"], task, row["Generation"], cid))
        rec = read_json(campaign.task_record(task))
        assert row["Correct"] is v["accepted"]
        n_correct += row["Correct"]
        assert row["Verdict_Reasons"] == v["reasons"]
        assert row["CUDA_Runtime"] == v["runtime_ms"]
        assert row["CUDA_Speedup_Native"] == v["speedup_eager"]
        assert row["PyTorch_Native_Runtime"] == v["baseline_eager_ms"]
        assert row["PyTorch_Compile_Runtime"] == v["baseline_compile_ms"]
        assert row["Max_Diff"] == v["max_abs_err"]
        assert row["CUDA_Code"] == campaign.candidate(row["LLM"], task, row["Generation"],
                                                      cid).read_text()
        assert row["PyTorch_Code_Module"] == rec["source"]
        assert row["PyTorch_Code_Functional"] == rec["functional_source"]
        assert row["Parent_IDs"] == meta["parents"]
        assert row["Tokens"] == meta["tokens_in"] + meta["tokens_out"]
        assert row["Cost_USD"] == pytest.approx(meta["cost_usd"])
        if v["accepted"]:
            assert row["Error"] == ""
        elif v["error"]:
            assert row["Error"] == v["error"]
        else:
            assert row["Error"] == "; ".join(v["reasons"])
    # per llm per task per gen one "a" candidate, accepted except fakellm's last task
    assert n_correct == 2 * 3 * 2 - 2
    profiled = df.filter(pl.col("NCU_Profile").is_not_null())
    prof = read_json(campaign.profile("offline", "L1_1_ReLU"))
    assert profiled["Kernel_Name"].to_list() == [prof["candidate"]]
    assert profiled["Torch_Profile"].item() == prof["torch_profile"]
    assert profiled["Clang_Tidy"].item() is None
    assert df.filter(pl.col("Kernel_Name") != prof["candidate"])["Torch_Profile"].null_count() \
        == df.height - 1


def test_empty_level_keeps_the_schema_and_card(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path, tasks=1, gens=1, llms=("offline",))
    write_task(c, 3, 1, "Empty")  # a task record, nothing verified
    paths = export_campaign(tmp_path, "test")
    assert [p.name for p in paths] == ["level_1.parquet", "level_3.parquet"]
    empty = pl.read_parquet(paths[1])
    assert empty.height == 0 and empty.columns == ARCHIVE_COLUMNS
    assert dict(empty.schema) == ARCHIVE_SCHEMA
    card = (c.archive_dir() / "README.md").read_text()
    assert "`strict`" in card and "`fake-cpu`" in card and "`Correct`" in card
    for col in ARCHIVE_COLUMNS:
        assert f"`{col}`" in card


def test_reexport_replaces_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = make_fake_campaign(tmp_path, tasks=1, gens=1, llms=("offline",))
    main([str(tmp_path), "test"])
    assert "level_1.parquet" in capsys.readouterr().out
    assert pl.read_parquet(c.archive_dir() / "level_1.parquet").height == 3
    add_candidate(c, "offline", "L1_1_ReLU", 1, accepted=True, speedup=3.0, tag="late")
    export(c)
    df = pl.read_parquet(c.archive_dir() / "level_1.parquet")
    assert df.height == 4 and df.filter(pl.col("Generation") == 1)["Correct"].to_list() == [True]


def test_consumers_do_not_import_mlflow() -> None:
    code = ("import sys, assay.collect, assay.archive.export, assay.report.compare, "
            "assay.report.html, assay.track.mlflow_log; "
            "assert 'mlflow' not in sys.modules, 'mlflow imported'; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
