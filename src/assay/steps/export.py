"""Step `export`: the campaign's archive as one parquet file per level (polars).

python -m assay.steps.export [overrides]

Writes ``archive/level_<n>.parquet`` and the dataset card ``archive/README.md``.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app

log = logging.getLogger("assay.export")


def export_step(cfg: DictConfig) -> list:
    from omegaconf import OmegaConf

    from assay.archive.export import export

    c = app.campaign(cfg)
    # The card states the verifier settings the campaign runs with: this step's own overrides
    # are the campaign's, so it reads no settings file of the results tree.
    settings = OmegaConf.to_container(cfg.verify, resolve=True, enum_to_str=True)
    paths = export(c, verify_settings=settings)
    for p in paths:
        log.info("wrote %s", p)
    return paths


main = app.step(export_step)

if __name__ == "__main__":
    app.run_script(main)
