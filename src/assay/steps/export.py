"""Step `export`: the campaign's archive as one parquet file per level (polars).

python -m assay.steps.export [overrides]
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app

log = logging.getLogger("assay.export")


def export_step(cfg: DictConfig) -> list:
    from assay.archive.export import export

    c = app.campaign(cfg)
    paths = export(c)
    for p in paths:
        log.info("wrote %s", p)
    return paths


main = app.step(export_step)

if __name__ == "__main__":
    main()
