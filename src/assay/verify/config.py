"""The verify config group (config/verify/*.yaml) as the harness's dataclasses."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from assay.verify.settings import SandboxLimits, VerifyConfig


def from_cfg(node: DictConfig) -> VerifyConfig:
    d = OmegaConf.to_container(node, resolve=True)
    limits = SandboxLimits(**d.pop("limits", {}))
    return VerifyConfig(**d, limits=limits)
