"""Step `report`: the campaign's static HTML report, and the backends compared on stdout.

python -m assay.report [overrides]
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app

log = logging.getLogger("assay.report")


def report(cfg: DictConfig):
    from assay.report.compare import compare_table, render_compare
    from assay.report.html import write_report

    c = app.campaign(cfg)
    path = write_report(c)
    log.info("wrote %s", path)
    print(render_compare(compare_table([c])))
    return path


main = app.step(report)

if __name__ == "__main__":
    main()
