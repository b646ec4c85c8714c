"""Step `device`: the device's measured peaks (copy bandwidth, fp32 matmul rate), ``device.json``.

python -m assay.steps.device [overrides]

One file per campaign, read by translate, evolve, verify, export and report (the roofline).
"""

from __future__ import annotations

from omegaconf import DictConfig

from assay import app
from assay.bench.device import peaks
from assay.layout import write_json


def device(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    with app.cpu_timing(cfg):
        out = peaks("cuda" if app.target(cfg) == "cuda" else "cpu")
    write_json(c.device(), out)
    return out


main = app.step(device, gpu=True, timing=True)

if __name__ == "__main__":
    app.run_script(main)
