"""Proposers: what writes candidates (``base.Proposer``), the offline synthesizer and the
litellm-backed LLMs; ``make_proposer`` picks one from the config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from assay.propose.base import Proposer


def make_proposer(cfg: DictConfig, tgt: str) -> Proposer:
    """The proposer named by the ``llm`` config group (its kind is one of schemas.LLMKind)."""
    from assay.schemas import LLMKind

    llm = cfg.llm
    if llm.kind == LLMKind.offline:
        from assay.propose.offline import OfflineSynthesizer

        # Under the strict policy the library forms (cuBLAS/cuDNN + a fused epilogue) would
        # always be rejected by the kernel audit: the synthesizer leaves them out.
        return OfflineSynthesizer(target=tgt, policy=str(cfg.verify.policy))
    from assay.propose.llm import LiteLLMProposer

    cache = llm.cache_dir or str(Path(cfg.results_dir) / ".llm-cache")
    return LiteLLMProposer(
        name=llm.name, model=llm.model, api_base=llm.api_base, api_key_env=llm.api_key_env,
        temperature=llm.temperature, max_tokens=llm.max_tokens, timeout_s=llm.timeout_s,
        max_retries=llm.max_retries, cache_dir=cache, target=tgt,
        prompts_dir=llm.prompts_dir, input_cost_per_1k=llm.input_cost_per_1k,
        output_cost_per_1k=llm.output_cost_per_1k, models=[dict(m) for m in llm.models],
        concurrency=llm.concurrency, max_stepping_stones=cfg.evolve.stepping_stones,
        send_seed=llm.send_seed)
