"""The LLM proposer: prompts rendered from ``prompts/*.j2``, sent through litellm, answers
turned into candidate files.

One completion per child. Every answer is cached on disk (when ``cache_dir`` is set) under a
key that covers everything that shapes the request (model, api_base, messages, temperature,
max_tokens), the request's index, and a number drawn from the operator's seeded ``rng`` when
one is passed; so a rerun replays the same answers, the same candidates and the same token
and cost accounting without a single HTTP request (and without an API key), while asking
twice for the same prompt (one parent mutated twice) gets two different answers.

Ensembles: a backend may list several models (``models=[{"model": ..., "weight": ...}]``, each
optionally with its own ``api_base``, ``api_key_env`` and prices). Each request picks one, with
probability proportional to its weight, from a generator seeded by the request's own number
drawn from the operator's seeded ``rng`` (and its index): the search's rng is never consumed
by the choice, the same campaign picks the same models, and the picked model joins the cache
key and is recorded in the proposal (``model``).

Every request also carries an OpenAI ``seed`` derived from the same draw and index (``send_seed``;
providers without one drop it through litellm's ``drop_params``), so providers that honour it
sample reproducibly, and a scripted test server can answer from it.

Transient failures (HTTP 429, 5xx, timeouts, connection errors, unparseable or malformed
responses) are retried with exponential backoff and jitter; client errors (bad key, bad
request, unknown model) fail at once with ``LLMError``. A prompt that exceeds the model's
context window, or that the provider refuses on content policy, becomes a declined proposal.

litellm is imported lazily, inside the call, with the local cost map forced: the GPU steps
import ``assay.propose`` pieces without ever loading litellm, and no call reaches the network
for pricing data.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from assay.propose import prompts as P
from assay.schemas import EvolveConfig, LLMConfig
from assay.propose.base import Parent, TaskContext
from assay.propose.extract import NoCodeError, extract_candidate, parse_strategy
from assay.records import Proposal

__all__ = ["LLMError", "LiteLLMProposer", "Answer", "ModelChoice", "cache_key",
           "import_litellm", "request_seed"]

log = logging.getLogger(__name__)

TARGETS = ("cpu", "cuda", "triton")  # triton: @triton.jit kernels, on either device
CACHE_VERSION = 1
_ERR_CHARS = 500


class LLMError(RuntimeError):
    """An LLM request that failed for good; the message names the backend and the last error."""

    def __init__(self, message: str, *, backend: str = "", attempts: int = 0,
                 last_error: BaseException | None = None, retryable: bool = False):
        super().__init__(message)
        self.backend = backend
        self.attempts = attempts
        self.last_error = last_error
        self.retryable = retryable


class _MalformedResponse(Exception):
    """A 200 response without a usable message (no choices, no message): retried."""


def import_litellm():
    """Import litellm with every remote config fetch disabled (cost map, beta headers)."""
    # litellm reads these at import (cost map) or on first use (beta headers); the value must
    # be "true" case-insensitively (litellm_core_utils/get_model_cost_map.py).
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS"] = "True"
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def cache_key(model: str, api_base: str | None, messages: Sequence[Mapping[str, Any]],
              temperature: float, max_tokens: int, index: int,
              extra: Mapping[str, Any] | None = None, draw: int | None = None) -> str:
    """sha256 of the canonical JSON of everything that shapes one answer.

    ``extra`` (extra completion parameters) and ``draw`` (a number drawn from the caller's
    seeded rng) join the key only when given, so the key of a plain request is exactly
    (model, api_base, messages, temperature, max_tokens, index).
    """
    material: dict[str, Any] = {
        "model": model,
        "api_base": api_base,
        "messages": [dict(m) for m in messages],
        "temperature": float(temperature),
        "max_tokens": int(max_tokens),
        "index": int(index),
    }
    if extra:
        material["extra"] = dict(extra)
    if draw is not None:
        material["draw"] = int(draw)
    blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def request_seed(draw: int | None, index: int) -> int:
    """The sampling seed sent with a request: a 31-bit number from the draw and the index."""
    h = hashlib.sha256(f"{draw}:{int(index)}".encode()).hexdigest()
    return int(h[:8], 16) & 0x7FFFFFFF


@dataclass(frozen=True)
class ModelChoice:
    """One model of a backend (an ensemble has several), with what may differ per model."""

    model: str
    weight: float = 1.0
    api_base: str | None = None
    api_key_env: str | None = None
    input_cost_per_1k: float | None = None
    output_cost_per_1k: float | None = None


@dataclass
class Answer:
    """One completion: its text and accounting (or, for a declined request, the reason)."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    finish_reason: str | None = None
    cached: bool = False
    declined: str | None = None
    key: str = ""
    model: str = ""  # the model that answered (an ensemble's pick)


def _short(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    if len(msg) > _ERR_CHARS:
        msg = msg[:_ERR_CHARS] + "..."
    return f"{type(e).__name__}: {msg}"


class LiteLLMProposer:
    """A Proposer backed by any litellm model (OpenAI, Anthropic, Gemini, vLLM, Ollama, ...)."""

    # The defaults of the settings the `llm` config group holds are the schema's (one source).
    def __init__(self, *, name: str = "llm", model: str, api_base: str | None = None,
                 api_key_env: str | None = None, temperature: float = LLMConfig.temperature,
                 max_tokens: int = LLMConfig.max_tokens, timeout_s: float = LLMConfig.timeout_s,
                 max_retries: int = LLMConfig.max_retries,
                 backoff_s: float = 2.0, backoff_max_s: float = 60.0,
                 cache_dir: str | os.PathLike | None = None, target: str = "cuda",
                 prompts_dir: str | os.PathLike | None = None,
                 input_cost_per_1k: float | None = None,
                 output_cost_per_1k: float | None = None,
                 concurrency: int = LLMConfig.concurrency,
                 max_stepping_stones: int = EvolveConfig.stepping_stones,
                 extra_params: Mapping[str, Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 kind: str = "litellm",
                 models: Sequence[Mapping[str, Any]] | None = None,
                 send_seed: bool = LLMConfig.send_seed):
        if kind != "litellm":
            raise ValueError(f"llm={name}: LiteLLMProposer serves kind 'litellm', not {kind!r}")
        if not model and not models:
            raise ValueError(f"llm={name}: model is required (a litellm model string such as "
                             f"'openai/gpt-5'), or models: [{{model, weight}}, ...]")
        if target not in TARGETS:
            raise ValueError(f"llm={name}: target must be one of {TARGETS}, not {target!r}")
        if max_retries < 0 or max_tokens <= 0 or timeout_s <= 0:
            raise ValueError(f"llm={name}: need max_retries >= 0, max_tokens > 0, timeout_s > 0")
        self.name = name
        self.api_base = api_base or None
        self.api_key_env = api_key_env or None
        self.choices = self._choices(name, model, models, api_base, api_key_env,
                                     input_cost_per_1k, output_cost_per_1k)
        self.model = model or "+".join(c.model for c in self.choices)
        self.send_seed = bool(send_seed)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.target = target
        self.prompts_dir = Path(prompts_dir) if prompts_dir else None  # None: P.prompts_dir()
        self.input_cost_per_1k = input_cost_per_1k
        self.output_cost_per_1k = output_cost_per_1k
        self.concurrency = max(1, int(concurrency))
        self.max_stepping_stones = max(0, int(max_stepping_stones))
        self.extra_params = dict(extra_params or {})
        self.sleep = sleep
        self._jitter = random.Random()  # never the search's rng: jitter must not perturb it
        self._lock = threading.Lock()
        self._asked: dict[str, int] = {}  # request digest -> answers asked for so far
        self.stats = {"http_requests": 0, "retries": 0, "cache_hits": 0, "answers": 0,
                      "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}

    @staticmethod
    def _choices(name: str, model: str, models: Sequence[Mapping[str, Any]] | None,
                 api_base: str | None, api_key_env: str | None, input_cost: float | None,
                 output_cost: float | None) -> tuple[ModelChoice, ...]:
        """The backend's models: the ensemble's when ``models`` is given, else ``model``
        alone. Unset per-model settings fall back to the backend's."""
        if not models:
            return (ModelChoice(model, 1.0, api_base or None, api_key_env or None, input_cost,
                                output_cost),)
        known = {"model", "weight", "api_base", "api_key_env", "input_cost_per_1k",
                 "output_cost_per_1k"}
        out = []
        for i, m in enumerate(models):
            m = dict(m)
            unknown = sorted(set(m) - known)
            if unknown:
                raise ValueError(f"llm={name}: models[{i}] has unknown settings {unknown}")
            if not m.get("model"):
                raise ValueError(f"llm={name}: models[{i}] needs a model")
            weight = float(m.get("weight", 1.0) if m.get("weight") is not None else 1.0)
            if not weight > 0:
                raise ValueError(f"llm={name}: models[{i}] ({m['model']}) needs a weight > 0")

            def pick(key: str, default: Any) -> Any:
                return m[key] if m.get(key) is not None else default

            out.append(ModelChoice(str(m["model"]), weight,
                                   pick("api_base", api_base) or None,
                                   pick("api_key_env", api_key_env) or None,
                                   pick("input_cost_per_1k", input_cost),
                                   pick("output_cost_per_1k", output_cost)))
        return tuple(out)

    def choose(self, messages: Sequence[Mapping[str, Any]], index: int,
               draw: int | None = None) -> ModelChoice:
        """The model that answers request ``index`` (weighted, seeded by draw and index)."""
        if len(self.choices) == 1:
            return self.choices[0]
        material = draw if draw is not None else self.key(messages, -1)
        r = random.Random(f"{self.name}|{material}|{int(index)}")
        return r.choices(self.choices, weights=[c.weight for c in self.choices])[0]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **overrides: Any) -> "LiteLLMProposer":
        """Build from a ``config/llm/<name>.yaml`` mapping (keys as in the constructor)."""
        kw = {k: v for k, v in dict(cfg).items()}
        kw.update(overrides)
        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise ValueError(f"llm={kw.get('name', '?')}: unknown settings {unknown}")
        return cls(**kw)

    def __repr__(self) -> str:
        return f"LiteLLMProposer(name={self.name!r}, model={self.model!r})"

    # -- the Proposer protocol -----------------------------------------------------------------
    def translate(self, ctx: TaskContext, n: int = 1,
                  rng: random.Random | None = None) -> list[Proposal]:
        messages = self.messages("translate", ctx)
        return self._propose("translate", messages, n, [], rng)

    def mutate(self, ctx: TaskContext, parent: Parent, n: int = 1,
               rng: random.Random | None = None) -> list[Proposal]:
        messages = self.messages("mutate", ctx, [parent])
        return self._propose("mutate", messages, n, [parent.id], rng)

    def crossover(self, ctx: TaskContext, parents: list[Parent],
                  rng: random.Random | None = None, n: int = 1) -> list[Proposal]:
        if len(parents) < 2:
            raise ValueError(f"llm={self.name}: crossover needs 2 or 3 parents, got "
                             f"{len(parents)}")
        messages = self.messages("crossover", ctx, parents)
        return self._propose("crossover", messages, n, [p.id for p in parents], rng)

    def repair(self, ctx: TaskContext, parent: Parent,
               rng: random.Random | None = None, n: int = 1) -> list[Proposal]:
        messages = self.messages("repair", ctx, [parent])
        return self._propose("repair", messages, n, [parent.id], rng)

    def functional(self, ctx: TaskContext, rng: random.Random | None = None) -> Proposal:
        """Stage 1: the task rewritten as ``module_fn(*inputs, *params)`` plus a ``Model``
        calling it (``code`` is a task file, not a candidate; operator ``functional``)."""
        messages = self.messages("functional", ctx)
        return self._propose("functional", messages, 1, [], rng, class_name="Model")[0]

    # -- prompts -------------------------------------------------------------------------------
    def target_of(self, ctx: TaskContext) -> str:
        return ctx.target if getattr(ctx, "target", None) in TARGETS else self.target

    def messages(self, operator: str, ctx: TaskContext,
                 parents: Sequence[Parent] = ()) -> list[dict]:
        """The chat messages an operator sends (exposed for inspection and tests)."""
        record = ctx.record or {}
        context: dict[str, Any] = {
            "target": self.target_of(ctx),
            "task_id": ctx.task.id,
            "task_source": ctx.task.source,
            "stepping_stones": P.parent_views(
                list(ctx.stepping_stones or [])[: self.max_stepping_stones], P.STONE_CHARS),
            "functional_source": record.get("functional_source") if isinstance(record, dict)
            else None,
        }
        if operator in ("mutate", "repair"):
            context["parent"] = P.parent_view(parents[0])
        elif operator == "crossover":
            context["parents"] = P.parent_views(parents)
        return P.render(operator, prompts_dir=self.prompts_dir, **context)

    # -- answers -> proposals ------------------------------------------------------------------
    def _propose(self, operator: str, messages: list[dict], n: int, parents: list[str],
                 rng: random.Random | None, class_name: str = "ModelNew") -> list[Proposal]:
        if n <= 0:
            return []
        # Which answers to ask for. A rerun makes the same calls in the same order with the
        # same seeded rng, so it lands on the same keys and replays; a second request for the
        # same prompt (the same parent mutated twice, in one generation or the next) lands on
        # new keys and gets new answers instead of a replay of the first.
        draw = rng.getrandbits(63) if rng is not None else None
        start = self._reserve(messages, draw, n)
        indices = list(range(start, start + n))
        if self.concurrency == 1 or n == 1:
            answers = [self.ask(messages, i, draw) for i in indices]
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, n),
                                    thread_name_prefix=f"llm-{self.name}") as pool:
                futures = [pool.submit(self.ask, messages, i, draw) for i in indices]
                answers = [f.result() for f in futures]
        return [self._proposal(a, operator, parents, class_name) for a in answers]

    def _proposal(self, answer: Answer, operator: str, parents: list[str],
                  class_name: str) -> Proposal:
        base = dict(operator=operator, parents=list(parents), model=answer.model or self.model,
                    tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
                    cost_usd=answer.cost_usd, wall_s=answer.wall_s)
        if answer.declined is not None:
            return Proposal(code=None, declined=answer.declined, strategy="other", **base)
        text = answer.text or ""
        strategy = parse_strategy(text)
        try:
            code = extract_candidate(text, class_name)
        except NoCodeError as e:
            reason = str(e)
            if answer.finish_reason == "length":
                reason += f" (the answer was cut at max_tokens={self.max_tokens})"
            return Proposal(code=None, declined=reason, strategy=strategy, **base)
        return Proposal(code=code, strategy=strategy, **base)

    def _reserve(self, messages: list[dict], draw: int | None, n: int) -> int:
        """The first request index for ``n`` more answers to this request: 0 the first time,
        then counting on (per proposer instance)."""
        digest = self.key(messages, -1, draw)
        with self._lock:
            start = self._asked.get(digest, 0)
            self._asked[digest] = start + n
        return start

    # -- one completion, cached and retried ----------------------------------------------------
    def key(self, messages: Sequence[Mapping[str, Any]], index: int,
            draw: int | None = None, choice: ModelChoice | None = None) -> str:
        if choice is None:
            model, api_base = self.model, self.api_base
        else:
            model, api_base = choice.model, choice.api_base
        return cache_key(model, api_base, messages, self.temperature,
                         self.max_tokens, index, self.extra_params, draw)

    def ask(self, messages: list[dict], index: int = 0, draw: int | None = None) -> Answer:
        """Answer number ``index`` to ``messages``: from the cache, else from the model."""
        choice = self.choose(messages, index, draw)
        key = self.key(messages, index, draw, choice)
        cached = self._cache_get(key)
        if cached is not None:
            self._count(cache_hits=1, answers=1, tokens_in=cached.tokens_in,
                        tokens_out=cached.tokens_out, cost_usd=cached.cost_usd)
            return cached
        seed = request_seed(draw, index) if self.send_seed else None
        answer = self._complete(messages, key, choice, seed)
        if answer.declined is None:
            self._cache_put(key, messages, index, answer)
        self._count(answers=1, tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
                    cost_usd=answer.cost_usd)
        return answer

    def api_key(self, choice: ModelChoice | None = None) -> str | None:
        env = self.api_key_env if choice is None else choice.api_key_env
        if env is None:
            return None
        value = os.environ.get(env)
        if not value:
            raise LLMError(f"environment variable {env} is not set "
                           f"(needed by llm={self.name})", backend=self.name)
        return value

    def _complete(self, messages: list[dict], key: str, choice: ModelChoice | None = None,
                  seed: int | None = None) -> Answer:
        choice = choice or self.choices[0]
        api_key = self.api_key(choice)
        extra = dict(self.extra_params)
        if seed is not None:
            extra.setdefault("seed", seed)
        litellm = import_litellm()
        start = time.monotonic()
        last: BaseException | None = None
        attempts = 0
        for attempt in range(self.max_retries + 1):
            attempts = attempt + 1
            self._count(http_requests=1)
            try:
                response = litellm.completion(
                    model=choice.model, messages=messages, api_base=choice.api_base,
                    api_key=api_key, timeout=self.timeout_s, temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    num_retries=0, max_retries=0,  # retries are ours (backoff, accounting)
                    drop_params=True,  # e.g. gpt-5 accepts only temperature=1
                    **extra)
                text, finish_reason = self._content(response)
            except Exception as e:  # noqa: BLE001 - classified below
                verdict = self._classify(litellm, e)
                if verdict == "decline":
                    return Answer(text=None, declined=f"{self.name}: {_short(e)}",
                                  wall_s=time.monotonic() - start, key=key, model=choice.model)
                if verdict == "fatal":
                    raise LLMError(f"llm={self.name} ({choice.model}) request failed, not "
                                   f"retried: {_short(e)}", backend=self.name,
                                   attempts=attempts, last_error=e) from e
                last = e
                if attempt < self.max_retries:
                    delay = self._delay(attempt, e)
                    log.warning("llm=%s: attempt %d/%d failed (%s); retrying in %.1f s",
                                self.name, attempts, self.max_retries + 1, _short(e), delay)
                    self._count(retries=1)
                    self.sleep(delay)
                continue
            tokens_in, tokens_out = self._usage(response)
            return Answer(text=text, tokens_in=tokens_in, tokens_out=tokens_out,
                          cost_usd=self._cost(litellm, response, tokens_in, tokens_out, choice),
                          wall_s=time.monotonic() - start, finish_reason=finish_reason,
                          key=key, model=choice.model)
        assert last is not None
        raise LLMError(f"llm={self.name} ({choice.model}) failed after {attempts} attempts; "
                       f"last error: {_short(last)}", backend=self.name, attempts=attempts,
                       last_error=last, retryable=True) from last

    @staticmethod
    def _content(response: Any) -> tuple[str, str | None]:
        choices = getattr(response, "choices", None)
        if not choices:
            raise _MalformedResponse("response has no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise _MalformedResponse("response choice has no message")
        content = getattr(message, "content", None)
        finish = getattr(choice, "finish_reason", None)
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p)
                              for p in content)
        return (content or ""), finish

    @staticmethod
    def _classify(litellm: Any, e: BaseException) -> str:
        """'retry' (transient), 'decline' (this prompt cannot be answered) or 'fatal'."""
        if isinstance(e, _MalformedResponse):
            return "retry"
        if isinstance(e, (litellm.ContextWindowExceededError,
                          litellm.ContentPolicyViolationError)):
            return "decline"
        transient = (litellm.RateLimitError, litellm.Timeout, litellm.APIConnectionError,
                     litellm.InternalServerError, litellm.ServiceUnavailableError,
                     litellm.BadGatewayError)
        if isinstance(e, transient):
            return "retry"
        try:
            import openai  # litellm depends on it; its base classes cover unmapped errors

            if isinstance(e, (openai.APIConnectionError, openai.RateLimitError,
                              openai.InternalServerError)):
                return "retry"
        except ImportError:  # pragma: no cover
            pass
        status = getattr(e, "status_code", None)
        if isinstance(status, int) and (status >= 500 or status in (408, 409, 429)):
            return "retry"
        return "fatal"

    def _delay(self, attempt: int, e: BaseException) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * (2 ** attempt))
        delay *= 0.5 + self._jitter.random()  # jitter in [0.5, 1.5)
        retry_after = None
        try:
            headers = getattr(getattr(e, "response", None), "headers", None) or {}
            value = headers.get("retry-after")
            retry_after = float(value) if value is not None else None
        except (TypeError, ValueError, AttributeError):
            retry_after = None
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.backoff_max_s))
        return delay

    @staticmethod
    def _usage(response: Any) -> tuple[int, int]:
        usage = getattr(response, "usage", None)
        if usage is None:
            return 0, 0
        get = usage.get if isinstance(usage, dict) else lambda k: getattr(usage, k, None)
        return int(get("prompt_tokens") or 0), int(get("completion_tokens") or 0)

    def _cost(self, litellm: Any, response: Any, tokens_in: int, tokens_out: int,
              choice: ModelChoice | None = None) -> float:
        """The per-1k overrides when set (explicit prices win), else litellm's price table,
        else 0.0 (an unpriced model)."""
        cin = self.input_cost_per_1k if choice is None else choice.input_cost_per_1k
        cout = self.output_cost_per_1k if choice is None else choice.output_cost_per_1k
        if cin is not None or cout is not None:
            return (tokens_in / 1000.0 * float(cin or 0.0)
                    + tokens_out / 1000.0 * float(cout or 0.0))
        try:
            return float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # noqa: BLE001 - litellm raises when the model is not in its map
            return 0.0

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                self.stats[k] = self.stats.get(k, 0) + v

    # -- the disk cache ------------------------------------------------------------------------
    def _cache_path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> Answer | None:
        path = self._cache_path(key)
        if path is None or not path.exists():
            return None
        try:
            d = json.loads(path.read_text())
            if d.get("version") != CACHE_VERSION or d.get("key") != key:
                return None
            return Answer(text=d["answer"], tokens_in=int(d["tokens_in"]),
                          tokens_out=int(d["tokens_out"]), cost_usd=float(d["cost_usd"]),
                          wall_s=float(d.get("wall_s", 0.0)),
                          finish_reason=d.get("finish_reason"), cached=True, key=key,
                          model=str(d.get("model") or ""))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("llm=%s: ignoring unreadable cache entry %s (%s)", self.name, path, e)
            return None

    def _cache_put(self, key: str, messages: list[dict], index: int, answer: Answer) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        record = {
            "version": CACHE_VERSION, "key": key, "backend": self.name,
            "model": answer.model or self.model,
            "api_base": self.api_base, "temperature": self.temperature,
            "max_tokens": self.max_tokens, "index": index, "messages": messages,
            "answer": answer.text, "finish_reason": answer.finish_reason,
            "tokens_in": answer.tokens_in, "tokens_out": answer.tokens_out,
            "cost_usd": answer.cost_usd, "wall_s": answer.wall_s, "created": time.time(),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:12]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, ensure_ascii=False, indent=1)
            os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
