"""collect() and the archive export (parquet per level, Sakana schema + ours)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from assay.archive.export import (ARCHIVE_COLUMNS, ARCHIVE_SCHEMA, DATASETS_TYPES, export,
                                  export_campaign, main, schema_from_card)
from assay.collect import COLLECT_SCHEMA, collect, device_info, tracked_runs
from assay.layout import Campaign, read_json, write_json

try:
    from fake_results import FAKE_DEVICE, add_candidate, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.fake_results import FAKE_DEVICE, add_candidate, make_fake_campaign, write_task

SAKANA = ["Op_Name", "Level_ID", "Task_ID", "Kernel_Name", "CUDA_Runtime",
          "PyTorch_Native_Runtime", "PyTorch_Compile_Runtime", "CUDA_Speedup_Native",
          "CUDA_Speedup_Compile", "CUDA_Code", "PyTorch_Code_Module", "PyTorch_Code_Functional",
          "Correct", "Max_Diff", "Error", "NCU_Profile", "Torch_Profile", "Clang_Tidy"]
OURS = ["Verdict_Reasons", "Candidate_ID", "Parent_IDs", "Generation", "LLM", "Tokens",
        "Cost_USD", "PyTorch_Native_Default_Runtime"]


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


# ---------------------------------------------------------------------------------------------
# the dataset through `datasets` and polars, against the card's documented schema


def _features(datasets_mod, type_name: str):
    """The ``datasets`` feature a DATASETS_TYPES string names."""
    if type_name.startswith("LargeList(") and type_name.endswith(")"):
        return datasets_mod.LargeList(_features(datasets_mod, type_name[len("LargeList("):-1]))
    return datasets_mod.Value(type_name)


@pytest.fixture
def hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``datasets``, offline, caching under tmp_path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import datasets

    datasets.disable_progress_bars()
    return datasets


def test_card_documents_schema_policy_and_hardware(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path)
    write_task(c, 3, 1, "Empty")
    export(c)
    card = (c.archive_dir() / "README.md").read_text()
    documented = schema_from_card(card)
    assert list(documented) == ARCHIVE_COLUMNS
    assert documented == {k: (str(v), DATASETS_TYPES[k]) for k, v in ARCHIVE_SCHEMA.items()}
    # the verifier's policy, its settings and the checks it ran
    assert "Policy `strict`" in card and "`roofline_margin`" in card
    assert "`correctness` |" in card and "`compiles` |" in card
    # the hardware, from device.json
    assert "**fake-cpu**" in card and "2 GB/s" in card and "0.2 TFLOP/s" in card
    # Hugging Face front matter: one split per level with rows
    assert card.startswith("---\n") and "configs:" in card
    assert "split: level_1" in card and "split: level_2" in card
    assert "split: level_3" not in card and "`level_3.parquet`: no verified candidate" in card


def test_card_states_given_verify_settings(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path, tasks=1, gens=1, llms=("offline",))
    (c.root / "device.json").unlink()
    export(c, verify_settings={"policy": "strict", "roofline_margin": 0.75})
    card = (c.archive_dir() / "README.md").read_text()
    assert "from the export step's config" in card and "`roofline_margin`: 0.75" in card
    assert "no `device.json`" in card


def test_dataset_round_trips_through_datasets_and_polars(tmp_path: Path, hf) -> None:
    c = make_fake_campaign(tmp_path)
    write_task(c, 3, 1, "Empty")
    paths = {p.stem: p for p in export(c)}
    documented = schema_from_card((c.archive_dir() / "README.md").read_text())
    expected = hf.Features({k: _features(hf, ds_type) for k, (_, ds_type) in documented.items()})
    frames = {name: pl.read_parquet(p) for name, p in paths.items()}
    full = {name: p for name, p in paths.items() if frames[name].height}
    assert sorted(full) == ["level_1", "level_2"]

    # the parquet files, as `datasets` loads them
    ds = hf.load_dataset("parquet", data_files={k: str(v) for k, v in full.items()},
                         cache_dir=str(tmp_path / "cache"))
    assert sorted(ds) == sorted(full)
    for name, split in ds.items():
        assert split.features == expected
        assert split.column_names == ARCHIVE_COLUMNS
        assert split.num_rows == frames[name].height
        back = split.to_polars()
        assert dict(back.schema) == ARCHIVE_SCHEMA
        assert back.equals(frames[name])
        # row by row, lists and nulls included
        assert split[0] == frames[name].row(0, named=True)
        # and back to parquet through `datasets`, read by polars
        out = tmp_path / f"{name}-from-datasets.parquet"
        split.to_parquet(str(out))
        again = pl.read_parquet(out)
        assert dict(again.schema) == ARCHIVE_SCHEMA and again.equals(frames[name])

    # the archive folder itself: the card's configs name the splits
    whole = hf.load_dataset(str(c.archive_dir()), cache_dir=str(tmp_path / "cache2"))
    assert sorted(whole) == ["level_1", "level_2"]
    assert whole["level_2"].features == expected
    assert whole["level_1"].to_polars().equals(frames["level_1"])
    # the empty level: polars reads it with the full schema
    assert frames["level_3"].height == 0 and dict(frames["level_3"].schema) == ARCHIVE_SCHEMA
    # documented polars dtypes are the files' own
    for name, (pl_type, _) in documented.items():
        assert str(frames["level_1"].schema[name]) == pl_type


def test_device_info_and_tracked_runs(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path, tasks=2, gens=1, tracked=True)
    dev = device_info(c)
    assert dev["name"] == "fake-cpu" and dev["bandwidth_gbs"] == FAKE_DEVICE["bandwidth_gbs"]
    assert dev["flops_tflops"] == FAKE_DEVICE["flops_tflops"]
    runs = tracked_runs(c)
    assert sorted(runs) == [(lm, t) for lm in ("fakellm", "offline")
                            for t in ("L1_1_ReLU", "L2_1_Conv2d_ReLU_BiasAdd")]
    assert all(r["experiment_id"] == "7" and len(r["run_id"]) == 32 for r in runs.values())
    # a broken or incomplete tracked.json is left out, not fatal
    c.tracked("offline", "L1_1_ReLU").write_text("{not json")
    write_json(c.tracked("fakellm", "L1_1_ReLU"), {"tracking_uri": "sqlite:///x.db"})
    assert len(tracked_runs(c)) == 2
    assert device_info(Campaign(tmp_path / "none")) == {}


def test_collect_keeps_failed_check_details(campaign: Campaign) -> None:
    df = collect(campaign)
    rejected = df.filter(~pl.col("accepted"))
    for row in rejected.iter_rows(named=True):
        assert len(row["reason_details"]) == len(row["reasons"])
        assert row["reason_details"][0] == f"{row['reasons'][0]} failed"
    assert df.filter(pl.col("accepted"))["reason_details"].list.len().max() == 0


def test_eager_under_default_numerics_reaches_the_archive(tmp_path: Path) -> None:
    """A baseline timed under PyTorch's default numerics too (cuDNN in TF32 on a GPU) fills
    PyTorch_Native_Default_Runtime for its task's rows; a task without one leaves it null."""
    from assay.collect import task_ids

    campaign = make_fake_campaign(tmp_path, tasks=2, llms=("offline",), gens=1)
    tasks = sorted(task_ids(campaign))
    base = read_json(campaign.baseline(tasks[0]))
    write_json(campaign.baseline(tasks[0]), {**base, "eager_default_ms": 0.61})
    frame = pl.concat([pl.read_parquet(p) for p in export(campaign)])
    got = {(r["Level_ID"], r["Task_ID"], r["PyTorch_Native_Default_Runtime"])
           for r in frame.iter_rows(named=True)}
    assert {v for _, _, v in got} == {0.61, None}, got


def test_every_task_that_ended_without_a_candidate_has_its_row(tmp_path: Path) -> None:
    """Issue #16: every task ends with an archive row, accepted, rejected with its reasons, or
    declined with its reason. A task whose file could not be run, whose translation came back
    with no code, or whose budget ran out first gets one row per LLM, without code, its
    reason in Verdict_Reasons and Error; one still waiting for verdicts, or not translated yet,
    gets none; a task with verdicts has only theirs."""
    from fake_results import add_declined, add_pending

    campaign = Campaign(tmp_path / "results" / "c")
    verified = write_task(campaign, 1, 1, "Verified")
    add_candidate(campaign, "offline", verified, 0, accepted=True)
    broken = write_task(campaign, 1, 2, "Broken", error="tasks/2_Broken.py: forward raised X")
    write_json(campaign.proposals("offline", broken, 0), {
        "generation": 0, "llm": "offline", "task": broken, "candidates": [], "declined": [],
        "tokens": 0, "cost_usd": 0.0})
    declined = write_task(campaign, 1, 3, "Declined")
    add_declined(campaign, "offline", declined, 0, reason="cannot express torch.cumsum")
    stopped = write_task(campaign, 2, 1, "Stopped")
    write_json(campaign.proposals("offline", stopped, 0), {
        "generation": 0, "llm": "offline", "task": stopped, "candidates": [], "declined": [],
        "tokens": 0, "cost_usd": 0.0, "stopped": "budget", "budget": "10 of 10 USD"})
    pending = write_task(campaign, 1, 4, "Pending")
    add_pending(campaign, "offline", pending, 0)
    write_task(campaign, 1, 5, "NotYet")  # a record and a baseline, no translation yet

    frame = pl.concat([pl.read_parquet(p) for p in export(campaign)])
    rows = {r["Op_Name"]: r for r in frame.iter_rows(named=True)}
    assert sorted(rows) == ["Broken", "Declined", "Stopped", "Verified"], sorted(rows)
    assert rows["Verified"]["Correct"] and rows["Verified"]["Kernel_Name"]
    for name, reason, error in [("Broken", "task_error", "forward raised X"),
                                ("Declined", "declined", "declined: cannot express torch.cumsum"),
                                ("Stopped", "stopped", "10 of 10 USD")]:
        r = rows[name]
        assert r["Verdict_Reasons"] == [reason] and error in r["Error"], r
        assert r["Kernel_Name"] is None and r["CUDA_Code"] is None and r["Correct"] is False
        assert r["LLM"] == "offline" and r["Generation"] == 0
        assert r["PyTorch_Native_Runtime"] == 1.0 and "class Model" in r["PyTorch_Code_Module"]
    assert rows["Declined"]["Tokens"] == 320 and rows["Stopped"]["Level_ID"] == 2
