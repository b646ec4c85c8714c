"""Step `report`: the campaign's static HTML report, and the backends compared on stdout.

python -m assay.steps.report [overrides]
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app

log = logging.getLogger("assay.report")


def report(cfg: DictConfig):
    """Keys (config.yaml): ``mlflow.ui_url``, the
    MLflow UI the run links point to (else $ASSAY_MLFLOW_UI, else http://localhost:5000), and
    ``report.compare_with``, a list of other campaigns (same results_dir) to compare with."""
    from omegaconf import OmegaConf

    from assay.layout import Campaign
    from assay.report.compare import compare_table, render_compare
    from assay.report.html import write_report

    c = app.campaign(cfg)
    names = OmegaConf.select(cfg, "report.compare_with", default=None) or []
    if isinstance(names, str):
        names = [names]
    others = [Campaign.at(cfg.results_dir, str(n)) for n in names]
    missing = [str(o.root) for o in others if not o.root.is_dir()]
    if missing:
        raise app.UserError(f"report.compare_with: no such campaign folder: {', '.join(missing)}")
    ui = OmegaConf.select(cfg, "mlflow.ui_url", default=None)
    path = write_report(c, mlflow_ui=str(ui) if ui else None, compare_with=others)
    log.info("wrote %s", path)
    print(render_compare(compare_table([c, *others])))
    return path


main = app.step(report)

if __name__ == "__main__":
    app.run_script(main)
