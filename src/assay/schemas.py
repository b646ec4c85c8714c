"""Dataclass schemas of the config groups, registered with Hydra's ConfigStore.

Each group's YAML files start from its schema (`defaults: [schema, _self_]`), so a misspelled
key or a value of the wrong type fails at startup with Hydra's one-line message instead of
surfacing deep inside a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from assay.verify.settings import VerifyConfig


@dataclass
class ModelChoiceConfig:
    """One model of an ensemble backend (``llm.models``); unset fields take the backend's."""

    model: str = MISSING
    weight: float = 1.0
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None
    input_cost_per_1k: Optional[float] = None
    output_cost_per_1k: Optional[float] = None


@dataclass
class LLMConfig:
    name: str = MISSING  # the backend's label in results/ and MLflow
    kind: str = MISSING  # offline | litellm
    model: str = ""
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None  # the NAME of the variable holding the key
    temperature: float = 0.7
    max_tokens: int = 8192
    timeout_s: float = 180.0
    max_retries: int = 4
    cache_dir: Optional[str] = None
    input_cost_per_1k: Optional[float] = None
    output_cost_per_1k: Optional[float] = None
    # An ensemble: several models, one picked per request by weight (seeded). Empty: `model`.
    models: list[ModelChoiceConfig] = field(default_factory=list)
    # Budget cap of this backend over the whole campaign (all tasks and generations), summed
    # from the proposals.json files: once reached, translate/evolve stop asking and write
    # their generation with `stopped: budget`. null: no cap.
    budget_usd: Optional[float] = None
    budget_tokens: Optional[int] = None
    concurrency: int = 4  # parallel requests of one operator call (translate's n answers)
    send_seed: bool = True  # send an OpenAI `seed` per request (derived from the search seed)


@dataclass
class TasksConfig:
    source: str = MISSING
    size: str = "auto"  # auto | small | large
    levels: Optional[list[int]] = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    limit: Optional[int] = None


@dataclass
class EvolveConfig:
    generations: int = 2
    translate_n: int = 2
    children: int = 2
    population: int = 6
    crossover_rate: float = 0.3
    crossover_parents: int = 2
    repair: bool = True
    stage1_functional: bool = False
    stepping_stones: int = 2


@dataclass
class TargetConfig:
    name: str = "auto"  # auto | cpu | cuda


@dataclass
class ProfileConfig:
    top_k: int = 1
    torch_profiler: bool = True
    ncu: str = "auto"  # auto | on | off
    ncu_metrics: list[str] = field(default_factory=list)
    clang_tidy: str = "auto"  # auto | on | off
    timeout_s: float = 300.0


def register() -> None:
    cs = ConfigStore.instance()
    for group, node in (("llm", LLMConfig), ("tasks", TasksConfig), ("evolve", EvolveConfig),
                        ("verify", VerifyConfig), ("target", TargetConfig),
                        ("profile", ProfileConfig)):
        cs.store(group=group, name="schema", node=node)
