"""Dataclass schemas of the whole config, registered with Hydra's ConfigStore.

``AssayConfig`` is the root (``config/config.yaml`` starts from it) and each group's YAML files
start from their group's schema (``defaults: [schema, _self_]``), so a misspelled key, a value
of the wrong type or a choice outside its Enum fails at start, in one line naming the key and
the allowed values (``assay.app.step``), instead of surfacing deep inside a step.

Defaults live here and only here: code that needs one reads it from these classes
(``LLMConfig.timeout_s``), never writes a second copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from assay.verify.settings import VerifyConfig

# Choice fields (see assay.verify.settings for the verifier's: Policy, OnDegenerate, Transfer).


class LLMKind(StrEnum):
    offline = "offline"  # the template synthesizer, no network
    litellm = "litellm"  # any model litellm reaches


class TaskSize(StrEnum):
    auto = "auto"  # medium on cpu, large on cuda
    small = "small"
    medium = "medium"
    large = "large"


class TargetName(StrEnum):
    auto = "auto"  # cuda when a GPU is visible, else cpu
    cpu = "cpu"  # C++ kernels on the host
    cuda = "cuda"  # CUDA kernels
    # Python candidates launching @triton.jit kernels: compiled on a GPU; without one they run
    # on cpu tensors in Triton's interpreter (TRITON_INTERPRET=1), for tests and CI
    triton = "triton"


class Toggle(StrEnum):
    auto = "auto"  # on when the tool is installed
    on = "on"
    off = "off"


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
    kind: LLMKind = MISSING
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
    prompts_dir: Optional[str] = None  # Jinja2 prompt templates; null: the bundled prompts/


@dataclass
class TasksConfig:
    source: str = MISSING
    size: TaskSize = TaskSize.auto
    levels: Optional[list[int]] = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    limit: Optional[int] = None
    # The extract step loads each task in a sandbox: its time limit, and the most memory one
    # task's inputs and weights may take (null: a quarter of RAM on cpu, half the GPU's on cuda).
    extract_timeout_s: float = 600.0
    max_task_bytes: Optional[int] = None


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
    name: TargetName = TargetName.auto
    # cpu target: threads every timing step computes on (eager, compile and candidates alike);
    # 0 = one per core. See config/target/cpu.yaml.
    cpu_threads: int = 1


@dataclass
class ProfileConfig:
    top_k: int = 1
    torch_profiler: bool = True
    ncu: Toggle = Toggle.auto
    # ncu only where the best kernel is at least this many times faster than eager (0: every
    # task's best): its run holds the device 5-40 s a task, most of a profile step
    ncu_min_speedup: float = 0.0
    ncu_metrics: list[str] = field(default_factory=list)
    clang_tidy: Toggle = Toggle.auto
    timeout_s: float = 300.0


@dataclass
class BaselinesConfig:
    compile: bool = True  # also time torch.compile (inductor) as a baseline
    compile_mode: str = "default"  # torch.compile's mode (default, reduce-overhead, ...)
    # cuda: compile on fake tensors before the device is taken (bench/prewarm.py), so the
    # compile with it held is a cache hit
    prewarm: bool = True


@dataclass
class BuildConfig:
    """The compile service (cuda target): builds run on CPU cores while the GPU verifies."""

    workers: int = 4  # 0: each worker builds its own kernels
    timeout_s: float = 600.0


@dataclass
class MlflowConfig:
    tracking_uri: str = "sqlite:///${results_dir}/mlflow.db"
    ui_url: str = "http://localhost:5000"  # where the report's run links point (`mlflow ui`)


@dataclass
class ReportConfig:
    compare_with: list[str] = field(default_factory=list)  # campaigns shown beside this one


@dataclass
class AssayConfig:
    """The root: every top-level key of config/config.yaml."""

    llm: LLMConfig = MISSING
    tasks: TasksConfig = MISSING
    evolve: EvolveConfig = MISSING
    verify: VerifyConfig = MISSING
    target: TargetConfig = MISSING
    profile: ProfileConfig = MISSING
    campaign: str = "default"  # results/<campaign>/; one MLflow experiment per campaign
    results_dir: str = "results"
    llms: list[str] = field(default_factory=lambda: ["offline"])  # names of files in llm/
    task: Optional[str] = None  # set by the workflow for per-task steps
    gen: int = 0  # set by the workflow for per-generation steps
    seed: int = 0  # every random choice of the search derives from it
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    report: ReportConfig = field(default_factory=ReportConfig)


ROOT = "assay_schema"  # the root schema's name in config/config.yaml's defaults list


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name=ROOT, node=AssayConfig)
    for group, node in (("llm", LLMConfig), ("tasks", TasksConfig), ("evolve", EvolveConfig),
                        ("verify", VerifyConfig), ("target", TargetConfig),
                        ("profile", ProfileConfig)):
        cs.store(group=group, name="schema", node=node)
