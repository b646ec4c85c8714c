"""The files that ship inside the package: the Hydra config, the prompt templates, the campaign
workflow (Snakefile and workflow/) and the bundled tasks.

They are found through ``importlib.resources``, so an installed wheel works outside the
checkout. In the checkout, ``src/assay/{config,prompts,Snakefile,workflow,data}`` are links to
the top-level folders that users know and edit; the wheel holds copies (pyproject's
package-data).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from assay import env


def package_dir() -> Path:
    """The installed ``assay`` package's folder (a plain folder: assay is not zip-safe)."""
    return Path(str(files("assay")))


def config_dir() -> Path:
    """The one place the config folder is looked up: ``$ASSAY_CONFIG_DIR``, else the package's."""
    return Path(env.CONFIG_DIR.get() or package_dir() / "config")


def prompts_dir() -> Path:
    """The bundled Jinja2 prompt templates (``llm.prompts_dir`` points elsewhere)."""
    return package_dir() / "prompts"


def snakefile() -> Path:
    """The campaign DAG; its rules, profiles and config sit beside it in the package."""
    return package_dir() / "Snakefile"


def resolve_data(path: str | Path) -> Path:
    """A data path from the config (``tasks.source``): absolute as given; relative to the
    current folder when it exists there, else to the package (``data/tasks``, the bundled
    suite, resolves from any folder)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return package_dir() / p
