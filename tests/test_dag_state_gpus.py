"""benchmarks/dag_state_gpus.py: a GPU DAG state's baselines get the GPU of the day they were
written, their modification times kept (no verdict turns stale)."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from datetime import datetime, timezone

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import dag_state_gpus as dsg  # noqa: E402


def _at(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc).timestamp()


def test_baselines_are_named_by_the_day_they_were_written(tmp_path):
    files = {  # name: (content, written)
        "./dag/kb/baselines/L2_1.json": ({"device": "cuda", "eager_ms": 9.1}, "2026-12-03 21:00"),
        "./dag/kb/baselines/L3_4.json": ({"device": "cuda", "eager_ms": 1.5}, "2026-12-07 01:50"),
        "./dag/kb/baselines/L3_9.json": ({"device": "cuda", "eager_ms": 2.0,
                                          "device_name": "NVIDIA B200"}, "2026-12-07 01:51"),
        "./dag/kb/baselines/L2_7.json": ({"device": "cuda", "eager_ms": None,
                                          "skipped": "record error"}, "2026-12-03 21:00"),
        "./dag/kb/offline/L2_1/gen_0/verdicts.json": ({"accepted": []}, "2026-12-03 21:05"),
    }
    src = tmp_path / "state.tgz"
    with tarfile.open(src, "w:gz") as tar:
        for name, (doc, when) in files.items():
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), _at(when)
            tar.addfile(info, io.BytesIO(data))
    dst = tmp_path / "named.tgz"
    assert dsg.main([str(src), str(dst), "--before", "2026-12-07=NVIDIA H200",
                     "--since", "NVIDIA H100 80GB HBM3"]) == 0
    with tarfile.open(dst, "r:gz") as tar:
        got = {m.name: (json.loads(tar.extractfile(m).read()), m.mtime) for m in tar}
    assert set(got) == set(files)
    assert got["./dag/kb/baselines/L2_1.json"][0]["device_name"] == "NVIDIA H200"
    assert got["./dag/kb/baselines/L3_4.json"][0]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert got["./dag/kb/baselines/L3_9.json"][0]["device_name"] == "NVIDIA B200"  # its own
    assert "device_name" not in got["./dag/kb/baselines/L2_7.json"][0]  # not timed
    assert got["./dag/kb/offline/L2_1/gen_0/verdicts.json"][0] == {"accepted": []}
    assert all(got[name][1] == _at(when) for name, (_, when) in files.items())


def test_bad_input_is_one_line_naming_it(tmp_path, capsys):
    assert dsg.main([str(tmp_path / "none.tgz"), str(tmp_path / "out.tgz")]) == 2
    assert "none.tgz: no such file" in capsys.readouterr().err
    (tmp_path / "bad.tgz").write_bytes(b"not a tarball")
    assert dsg.main([str(tmp_path / "bad.tgz"), str(tmp_path / "out.tgz")]) == 2
    assert "bad.tgz" in capsys.readouterr().err
