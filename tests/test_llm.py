"""The LLM proposer, for real through litellm, against a scripted server on 127.0.0.1.

Also: code extraction from messy answers, strategy parsing, and prompt rendering.
No test reaches beyond the loopback interface (checked after every test by an audit hook).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import REPO  # noqa: E402
from llm_server import ScriptedLLMServer  # noqa: E402

from assay.propose import prompts as P  # noqa: E402
from assay.propose.base import Parent, TaskContext  # noqa: E402
from assay.propose.extract import (NoCodeError, extract_candidate,  # noqa: E402
                                   fenced_blocks, parse_strategy)
from assay.propose.llm import LiteLLMProposer, LLMError, cache_key  # noqa: E402
from assay.tasks.model import Task  # noqa: E402

KEY_ENV = "ASSAY_TEST_LLM_KEY"

TASK_SOURCE = '''"""ReLU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import ctypes
import torch
import torch.nn as nn
from assay.bench.build import load_library

SRC = r"""
extern "C" void relu(const float* x, float* y, long n) {
    #pragma omp parallel for
    for (long i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.empty_like(x)
        return y
'''


def answer(code: str = CANDIDATE, strategy: str = "vectorization") -> str:
    return (f"The op is memory bound, so I stream it once.\n\nStrategy: {strategy}\n\n"
            f"```python\n{code}```\n\nThis should be fast.")


# -- no network: every connection of this process during a test must be to loopback ----------

_CONNECTS: list[tuple[str, object]] = []
_RECORDING = threading.Event()


def _audit(event: str, args: tuple) -> None:
    if not _RECORDING.is_set():
        return
    if event == "socket.connect":
        _CONNECTS.append((event, args[1]))
    elif event == "socket.getaddrinfo":
        _CONNECTS.append((event, args[0]))


if not getattr(sys, "_assay_llm_audit_installed", False):
    sys.addaudithook(_audit)
    sys._assay_llm_audit_installed = True  # type: ignore[attr-defined]


def _is_loopback(target: object) -> bool:
    if isinstance(target, tuple) and target:
        target = target[0]
    if isinstance(target, bytes):
        target = target.decode()
    if not isinstance(target, str):  # AF_UNIX paths etc.
        return True
    return target in ("127.0.0.1", "localhost", "::1") or target.startswith("/")


@pytest.fixture(autouse=True)
def loopback_only():
    _CONNECTS.clear()
    _RECORDING.set()
    try:
        yield
    finally:
        _RECORDING.clear()
    outside = [c for c in _CONNECTS if not _is_loopback(c[1])]
    assert not outside, f"a test reached beyond 127.0.0.1: {outside}"


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def task(tmp_path) -> Task:
    path = tmp_path / "level1" / "19_ReLU.py"
    path.parent.mkdir()
    path.write_text(TASK_SOURCE)
    return Task.from_file(path)


@pytest.fixture
def ctx(task) -> TaskContext:
    return TaskContext(task=task, target="cpu")


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test")


class FakeSleep:
    def __init__(self):
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def make(server: ScriptedLLMServer, **kw) -> LiteLLMProposer:
    kw.setdefault("sleep", FakeSleep())
    kw.setdefault("timeout_s", 10)
    kw.setdefault("concurrency", 1)
    return LiteLLMProposer(name=kw.pop("name", "scripted"),
                           model=kw.pop("model", "openai/scripted"),
                           api_base=server.url, api_key_env=KEY_ENV, **kw)


def parent(pid: str, code: str = CANDIDATE, **verdict) -> Parent:
    v = {"accepted": True, "runtime_ms": 0.5, "speedup_eager": 1.7, "reasons": [],
         "checks": {}}
    v.update(verdict)
    return Parent(id=pid, code=code, verdict=v, meta={"strategy": "fusion"},
                  profile={"summary": f"{pid}: DRAM throughput 81% of peak"})


# =============================================================================================
# extraction
# =============================================================================================

def test_extract_prefers_last_python_block_defining_modelnew():
    first = "import torch\nclass ModelNew:\n    version = 1\n"
    last = "import torch\nclass ModelNew:\n    version = 2\n"
    text = (f"Here is a draft:\n```python\n{first}```\nActually, better:\n```python\n{last}```\n"
            "Usage:\n```python\nm = ModelNew()\n```\n")
    assert extract_candidate(text) == last


def test_extract_falls_back_to_any_fence_and_unlabelled_blocks():
    code = "class ModelNew:\n    pass\n"
    assert extract_candidate(f"Code:\n```\n{code}```\n") == code
    assert extract_candidate(f"Code:\n```cuda\n{code}```\n") == code
    # a python block wins over a later non-python block
    py = "class ModelNew:\n    x = 'py'\n"
    assert extract_candidate(f"```python\n{py}```\n```\n{code}```") == py
    # CRLF line endings, indented fence, upper-case language tag, tilde fence
    assert extract_candidate(f"Answer:\r\n```Python\r\n{code}```\r\n".replace("\n", "\r\n")
                             .replace("\r\r\n", "\r\n")) == code
    assert extract_candidate("1. The file:\n   ```python\n   class ModelNew:\n       pass\n"
                             "   ```\n") == code
    assert extract_candidate(f"~~~python\n{code}~~~\n") == code


def test_extract_skips_a_broken_last_block_and_accepts_bare_code():
    good = "class ModelNew:\n    pass\n"
    bad = "class ModelNew(:\n    pass\n"
    assert extract_candidate(f"```python\n{good}```\nfix:\n```python\n{bad}```\n") == good
    # an answer that is nothing but the file
    assert extract_candidate("import torch\n\n" + good) == "import torch\n\n" + good
    # an unclosed fence at the end (the model forgot to close it) still counts
    assert extract_candidate(f"Strategy: other\n```python\n{good}") == good


def test_extract_errors_are_clear():
    with pytest.raises(NoCodeError, match="no python code block defining class ModelNew"):
        extract_candidate("I cannot help with that.")
    with pytest.raises(NoCodeError, match="no python code block defining class ModelNew"):
        extract_candidate("```python\nclass Model:\n    pass\n```")
    with pytest.raises(NoCodeError, match="empty answer"):
        extract_candidate("")
    with pytest.raises(NoCodeError, match=r"does not parse: .* line 3"):
        extract_candidate("```python\nimport torch\nclass ModelNew:\ndef f(:\n```")
    with pytest.raises(NoCodeError, match="not closed"):
        extract_candidate("```python\nclass ModelNew:\n    def forward(self, x):\n        return (")
    with pytest.raises(NoCodeError, match="does not define it"):
        extract_candidate("```python\n# class ModelNew is below\nx = 1\n```")


def test_fenced_blocks_and_strategy_parsing():
    text = "a\n```python\nx = 1\n```\nb\n````\n```nested```\n````\n"
    blocks = fenced_blocks(text)
    assert [(b.lang, b.code) for b in blocks] == [("python", "x = 1\n"), ("", "```nested```\n")]
    assert parse_strategy("Strategy: fusion\n```python\n```") == "fusion"
    assert parse_strategy("**Strategy:** Tensor Cores (wmma)") == "tensor_cores"
    assert parse_strategy("strategy = memory layout") == "memory_layout"
    assert parse_strategy("- Strategy: tiled shared memory") == "tiling"
    assert parse_strategy("No strategy line here") == "other"
    assert parse_strategy("Strategy: magic") == "other"
    # a comment in the code does not beat the line outside it
    assert parse_strategy("```python\n# Strategy: tiling\n```\nStrategy: fusion") == "fusion"


# =============================================================================================
# prompts
# =============================================================================================

def test_render_translate_for_both_targets(task):
    for target, must in (("cuda", ["cudaStream_t", "load_inline", "load_library"]),
                         ("cpu", ["OpenMP", 'lang="cpp"', "load_library"])):
        msgs = P.render("translate", target=target, task_id=task.id, task_source=task.source)
        assert [m["role"] for m in msgs] == ["system", "user"]
        system, user = msgs[0]["content"], msgs[1]["content"]
        for s in must:
            assert s in system, (target, s)
        assert "state_dict" in system and "same arguments" in system
        assert "Strategy:" in system and "tensor_cores" in system
        assert task.source.strip() in user  # the source verbatim, blank lines included
    with pytest.raises(P.PromptError, match="task_source"):
        P.render("translate", target="cpu", task_id=task.id)
    with pytest.raises(P.PromptError, match="not found"):
        P.render("nonexistent", target="cpu")


def test_render_mutate_and_repair_include_parent_code_and_verdict(task):
    bad = parent("cbad", code=CANDIDATE.replace("y = torch.empty_like(x)", "y = BROKEN"),
                 accepted=False, reasons=["correctness", "no_torch_ops"],
                 checks={"correctness": {"passed": False, "detail": "max abs err 2.5 > 1e-4"},
                         "no_torch_ops": {"passed": False, "detail": "called aten::relu"}},
                 speedup_eager=None, runtime_ms=None, error="")
    for op in ("mutate", "repair"):
        msgs = P.render(op, target="cuda", task_id=task.id, task_source=task.source,
                        parent=P.parent_view(bad))
        user = msgs[1]["content"]
        assert "y = BROKEN" in user
        assert "correctness" in user and "no_torch_ops" in user
        assert "max abs err 2.5 > 1e-4" in user and "called aten::relu" in user
    good = parent("cgood", runtime_ms=0.25, speedup_eager=3.5, speedup_compile=1.25,
                  baseline_eager_ms=0.875)
    user = P.render("mutate", target="cuda", task_id=task.id, task_source=task.source,
                    parent=P.parent_view(good))[1]["content"]
    assert "accepted: yes" in user and "3.5x vs eager" in user and "0.25 ms" in user
    assert "DRAM throughput 81% of peak" in user and "faster variant" in user
    # a long compiler log is clipped, keeping both ends
    log = "error: first\n" + "x" * 50_000 + "\nerror: last"
    rep = P.render("repair", target="cuda", task_id=task.id, task_source=task.source,
                   parent=P.parent_view(parent("clog", accepted=False, reasons=["compile"],
                                               checks={"compile": {"passed": False,
                                                                   "detail": log}})))
    assert "error: first" in rep[1]["content"] and "error: last" in rep[1]["content"]
    assert len(rep[1]["content"]) < 20_000


def test_render_functional_and_prompts_dir_override(task, tmp_path):
    msgs = P.render("functional", target="cpu", task_id=task.id, task_source=task.source)
    assert "module_fn" in msgs[0]["content"] and task.source.strip() in msgs[1]["content"]
    (tmp_path / "translate.j2").write_text("<|system|>\nsys {{ target }}\n<|user|>\n"
                                           "do {{ task_id }}\n")
    assert P.render("translate", prompts_dir=tmp_path, target="cpu", task_id="T") == [
        {"role": "system", "content": "sys cpu\n"}, {"role": "user", "content": "do T\n"}]
    # The bundled templates are the package's, which in the checkout are the top-level prompts/.
    assert P.prompts_dir().resolve() == (REPO / "prompts").resolve()
    # llm.prompts_dir reaches the proposer.
    from assay.app import compose
    from assay.propose import make_proposer

    cfg = compose(["llm=openai", f"llm.prompts_dir={tmp_path}"])
    assert make_proposer(cfg, "cpu").prompts_dir == tmp_path


def test_importing_the_proposer_does_not_import_litellm():
    code = ("import sys; import assay.propose.llm, assay.propose.prompts, "
            "assay.propose.extract; assert 'litellm' not in sys.modules, 'litellm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=REPO)


# =============================================================================================
# the proposer against the scripted server
# =============================================================================================

def test_translate_returns_code_tokens_and_strategy(ctx):
    with ScriptedLLMServer([answer()]) as server:
        prop = make(server, temperature=0.3, max_tokens=1234)
        out = prop.translate(ctx, 1, None)
        assert len(server.requests) == 1
        req = server.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"].get("Authorization") == "Bearer sk-test"
    body = req["json"]
    assert body["model"] == "scripted" and body["temperature"] == 0.3
    assert body["max_tokens"] == 1234
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert TASK_SOURCE.strip() in body["messages"][1]["content"]
    assert "OpenMP" in body["messages"][0]["content"]  # ctx.target == "cpu"
    [p] = out
    assert p.code == CANDIDATE and p.declined is None
    assert p.operator == "translate" and p.parents == [] and p.strategy == "vectorization"
    assert p.model == "openai/scripted"
    # the server counts words; litellm must pass its usage through
    words_in = sum(len(m["content"].split()) for m in body["messages"])
    assert (p.tokens_in, p.tokens_out) == (words_in, len(answer().split()))
    assert p.cost_usd == 0.0  # "openai/scripted" is not in litellm's price table
    assert p.wall_s > 0 and p.id and p.id.startswith("c")
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    # the audit hook is alive: it saw the loopback connection (and nothing else)
    assert any(ev == "socket.connect" for ev, _ in _CONNECTS)


def test_rate_limit_then_server_error_then_success_is_retried(ctx):
    sleep = FakeSleep()
    with ScriptedLLMServer([{"status": 429}, {"status": 500}, answer()]) as server:
        prop = make(server, sleep=sleep, max_retries=4, backoff_s=2.0)
        [p] = prop.translate(ctx, 1, None)
        assert len(server.requests) == 3
    assert p.code == CANDIDATE
    assert len(sleep.delays) == 2
    # exponential with jitter in [0.5, 1.5): 2 s * 2**attempt
    assert 1.0 <= sleep.delays[0] < 3.0 and 2.0 <= sleep.delays[1] < 6.0
    assert prop.stats["retries"] == 2 and prop.stats["http_requests"] == 3


def test_slow_answer_beyond_timeout_is_retried(ctx):
    with ScriptedLLMServer([{"sleep": 5, "answer": answer(strategy="fusion")},
                            answer(strategy="tiling")]) as server:
        prop = make(server, timeout_s=0.5)
        [p] = prop.translate(ctx, 1, None)
        assert len(server.requests) == 2
        first, second = (r["time"] for r in server.requests)
    assert second - first < 4.5  # the client gave up on the slow answer and asked again
    assert p.code == CANDIDATE and p.strategy == "tiling"


def test_garbage_and_malformed_are_retried_then_fail_clearly(ctx):
    with ScriptedLLMServer([{"garbage": True}, {"malformed": True}, answer()]) as server:
        [p] = make(server).translate(ctx, 1, None)
        assert len(server.requests) == 3 and p.code == CANDIDATE
    with ScriptedLLMServer([{"garbage": True}, {"malformed": True},
                            {"garbage": True}]) as server:
        prop = make(server, max_retries=2)
        with pytest.raises(LLMError) as err:
            prop.translate(ctx, 1, None)
        assert len(server.requests) == 3
    msg = str(err.value)
    assert "llm=scripted" in msg and "after 3 attempts" in msg and "last error" in msg
    assert err.value.backend == "scripted" and err.value.attempts == 3


def test_client_errors_are_not_retried(ctx):
    with ScriptedLLMServer([{"status": 401, "message": "Incorrect API key"},
                            answer()]) as server:
        with pytest.raises(LLMError, match=r"llm=scripted .*not retried.*Incorrect API key"):
            make(server).translate(ctx, 1, None)
        assert len(server.requests) == 1


def test_context_window_exceeded_is_a_decline(ctx):
    msg = ("This model's maximum context length is 8192 tokens. However, your messages "
           "resulted in 9000 tokens.")
    with ScriptedLLMServer([{"status": 400, "message": msg}]) as server:
        [p] = make(server).translate(ctx, 1, None)
        assert len(server.requests) == 1
    assert p.code is None and "ContextWindowExceeded" in p.declined


def test_answer_without_code_is_declined(ctx):
    script = ["I'm sorry, I can't write this kernel.",
              {"answer": "Strategy: tiling\n```python\nclass ModelNew(nn.Module):\n    def f(",
               "finish_reason": "length"}]
    with ScriptedLLMServer(script) as server:
        a, b = make(server).translate(ctx, 2, None)
        assert len(server.requests) == 2
    assert a.code is None and a.id is None
    assert a.declined == "answer has no python code block defining class ModelNew"
    assert a.tokens_out > 0  # a decline still costs its tokens
    assert b.code is None and "does not parse" in b.declined and "max_tokens" in b.declined
    assert b.strategy == "tiling"


def test_disk_cache_replays_without_http(ctx, tmp_path, monkeypatch):
    cache = tmp_path / "llm-cache"
    script = [answer(CANDIDATE.replace("pass", "pass  # 0") + "X = 0\n"),
              answer(CANDIDATE + "X = 1\n", strategy="fusion")]
    with ScriptedLLMServer(script) as server:
        first = make(server, cache_dir=cache, model="openai/gpt-4o").translate(ctx, 2, None)
        assert len(server.requests) == 2
        # a fresh proposer (a rerun) with the same settings: no HTTP at all, and no key needed
        monkeypatch.delenv(KEY_ENV)
        again = make(server, cache_dir=cache, model="openai/gpt-4o")
        second = again.translate(ctx, 2, None)
        assert len(server.requests) == 2
    assert [p.code for p in second] == [p.code for p in first]
    assert first[0].code != first[1].code  # the request index is part of the key
    assert [(p.tokens_in, p.tokens_out, p.cost_usd, p.strategy) for p in second] == \
           [(p.tokens_in, p.tokens_out, p.cost_usd, p.strategy) for p in first]
    assert first[0].cost_usd > 0  # gpt-4o is priced from litellm's local map
    assert again.stats["cache_hits"] == 2 and again.stats["http_requests"] == 0
    files = sorted(cache.rglob("*.json"))
    assert len(files) == 2 and not list(cache.rglob("*.tmp"))
    rec = json.loads(files[0].read_text())
    assert {"answer", "tokens_in", "tokens_out", "cost_usd", "messages", "key"} <= set(rec)
    # the key covers exactly (model, api_base, messages, temperature, max_tokens, index)
    msgs = again.messages("translate", ctx)
    keys = {cache_key("openai/gpt-4o", server.url, msgs, 0.7, 8192, i) for i in (0, 1)}
    assert keys == {f.stem for f in files}
    # changing a keyed setting misses the cache
    monkeypatch.setenv(KEY_ENV, "sk-test")
    with ScriptedLLMServer([answer()]) as server2:
        make(server2, cache_dir=cache, model="openai/gpt-4o").translate(ctx, 1, None)
        assert len(server2.requests) == 1  # new api_base (port): a new key


def test_missing_api_key_env_is_a_clear_error(ctx, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with ScriptedLLMServer([answer()]) as server:
        prop = make(server, name="openai")
        with pytest.raises(LLMError) as err:
            prop.translate(ctx, 1, None)
        assert len(server.requests) == 0
    assert str(err.value) == (f"environment variable {KEY_ENV} is not set "
                              f"(needed by llm=openai)")


def test_crossover_lists_all_parents_and_shows_their_code(ctx):
    parents = [parent(f"cp{i}", code=CANDIDATE + f"MARK_{i} = {i}\n", speedup_eager=1.0 + i)
               for i in range(3)]
    with ScriptedLLMServer([answer(strategy="fusion")]) as server:
        [p] = make(server).crossover(ctx, parents, None)
        user = server.requests[0]["json"]["messages"][1]["content"]
    assert p.operator == "crossover" and p.parents == ["cp0", "cp1", "cp2"]
    assert p.code == CANDIDATE and p.strategy == "fusion"
    for i in range(3):
        assert f"MARK_{i} = {i}" in user and f"cp{i}" in user and f"{1.0 + i:g}x vs eager" in user
    with pytest.raises(ValueError, match="2 or 3 parents"):
        make(server).crossover(ctx, parents[:1], None)


def test_mutate_and_repair_send_parent_code_and_verdict_reasons(ctx):
    failing = parent("cfail", code=CANDIDATE + "UNIQUE_PARENT_LINE = 1\n", accepted=False,
                     reasons=["compile"], speedup_eager=None,
                     checks={"compile": {"passed": False,
                                         "detail": "kernel.cpp:3: error: 'n' was not declared"}})
    stone = parent("cstone", code=CANDIDATE + "STONE_LINE = 1\n")
    ctx.stepping_stones = [stone]
    with ScriptedLLMServer([answer(), answer()]) as server:
        prop = make(server)
        [m] = prop.mutate(ctx, failing, 1, None)
        [r] = prop.repair(ctx, failing, None)
        users = [q["json"]["messages"][1]["content"] for q in server.requests]
    assert (m.operator, m.parents) == ("mutate", ["cfail"])
    assert (r.operator, r.parents) == ("repair", ["cfail"])
    for user in users:
        assert "UNIQUE_PARENT_LINE = 1" in user
        assert "failed checks: compile" in user
        assert "'n' was not declared" in user
    assert "STONE_LINE" in users[0]  # stepping stones inform mutation, not repair
    assert "STONE_LINE" not in users[1]


def test_parallel_children_and_cost_overrides(ctx):
    with ScriptedLLMServer(lambda request: answer()) as server:
        prop = make(server, concurrency=3, input_cost_per_1k=1.0, output_cost_per_1k=2.0)
        props = prop.translate(ctx, 3, None)
        assert len(server.requests) == 3
    for p in props:
        assert p.code == CANDIDATE
        assert p.cost_usd == pytest.approx(p.tokens_in / 1000 * 1.0 + p.tokens_out / 1000 * 2.0)
    assert prop.stats["answers"] == 3


def test_functional_rewrite_and_from_config(ctx):
    functional = ("```python\nimport torch\n\ndef module_fn(x):\n    return torch.relu(x)\n\n"
                  "class Model(torch.nn.Module):\n    def forward(self, x):\n"
                  "        return module_fn(x)\n```")
    with ScriptedLLMServer([functional]) as server:
        cfg = {"name": "local", "kind": "litellm", "model": "openai/scripted",
               "api_base": server.url, "api_key_env": KEY_ENV, "temperature": 0.7,
               "max_tokens": 8192, "timeout_s": 10, "max_retries": 4, "cache_dir": None,
               "input_cost_per_1k": None, "output_cost_per_1k": None}
        prop = LiteLLMProposer.from_config(cfg, target="cuda", sleep=FakeSleep())
        p = prop.functional(ctx)
        assert "module_fn" in server.requests[0]["json"]["messages"][0]["content"]
    assert p.operator == "functional" and "def module_fn" in p.code
    with pytest.raises(ValueError, match="unknown settings"):
        LiteLLMProposer.from_config({**cfg, "temprature": 1.0})


def test_server_script_exhaustion_and_sleep_then_next_step():
    from assay.propose.llm import import_litellm

    litellm = import_litellm()
    with ScriptedLLMServer([{"sleep": 0.1}, "after sleep"]) as server:
        r = litellm.completion(model="openai/x", messages=[{"role": "user", "content": "hi"}],
                               api_base=server.url, api_key="sk-test", max_retries=0)
        assert r.choices[0].message.content == "after sleep"
        with pytest.raises(litellm.BadRequestError, match="script exhausted"):
            litellm.completion(model="openai/x", messages=[{"role": "user", "content": "hi"}],
                               api_base=server.url, api_key="sk-test", max_retries=0)
        assert len(server.requests) == 2 and server.remaining == 0


def test_same_prompt_twice_gets_new_answers_and_reruns_replay(ctx, tmp_path):
    cache = tmp_path / "cache"
    p0 = parent("cp")
    script = [answer(CANDIDATE + f"CHILD = {i}\n") for i in range(6)]

    def generation(server, seed):
        prop = make(server, cache_dir=cache)
        rng = random.Random(seed)
        # the evolve step mutates the same parent once per child, with the generation's rng
        return prop, [prop.mutate(ctx, p0, 1, rng)[0].code for _ in range(2)]

    with ScriptedLLMServer(script) as server:
        _, gen1 = generation(server, seed=1)
        assert len(server.requests) == 2 and gen1[0] != gen1[1]
        rerun, again = generation(server, seed=1)  # a rerun of the same generation
        assert again == gen1 and len(server.requests) == 2
        assert rerun.stats["cache_hits"] == 2
        _, gen2 = generation(server, seed=2)  # the next generation: same parent, new children
        assert len(server.requests) == 4 and not set(gen2) & set(gen1)
        # without an rng, a repeated request counts on within the proposer
        prop = make(server, cache_dir=cache)
        a = prop.mutate(ctx, p0, 1, None)[0].code
        b = prop.mutate(ctx, p0, 1, None)[0].code
        assert len(server.requests) == 6 and a != b


# =============================================================================================
# ensembles and request seeds
# =============================================================================================

def test_ensemble_picks_models_by_weight_reproducibly(ctx, tmp_path):
    from collections import Counter

    models = [{"model": "openai/alpha", "weight": 3.0},
              {"model": "openai/beta", "weight": 1.0, "input_cost_per_1k": 1.0}]

    def reply(request):
        return answer(CANDIDATE + f"M = {request['model']!r}\n")

    def run(server):
        prop = make(server, model="", models=models, cache_dir=tmp_path / "cache")
        rng = random.Random(7)
        return prop, [prop.mutate(ctx, parent("cp"), 1, rng)[0] for _ in range(24)]

    with ScriptedLLMServer(reply) as server:
        prop, props = run(server)
        requests = list(server.requests)
        assert len(requests) == 24
        _, again = run(server)  # a rerun: the same picks, all replayed from the cache
        assert len(server.requests) == 24
    assert prop.model == "openai/alpha+openai/beta"
    seen = Counter(p.model for p in props)
    assert set(seen) == {"openai/alpha", "openai/beta"}
    assert seen["openai/alpha"] > seen["openai/beta"]  # 3:1
    for p, req in zip(props, requests):
        assert req["json"]["model"] == p.model.split("/", 1)[1]  # sent to the picked model
        assert p.code.endswith(f"M = {req['json']['model']!r}\n")
        assert (p.cost_usd > 0) == (p.model == "openai/beta")  # beta's own price
    assert [(p.model, p.code) for p in again] == [(p.model, p.code) for p in props]
    # every request carried a seed derived from the search rng's draw (distinct per request)
    seeds = [r["json"]["seed"] for r in requests]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == len(seeds)
    with pytest.raises(ValueError, match="weight > 0"):
        make(server, model="", models=[{"model": "openai/x", "weight": 0}])
    with pytest.raises(ValueError, match="unknown settings"):
        make(server, model="", models=[{"model": "openai/x", "wieght": 1}])


def test_seed_is_optional_and_the_single_model_key_is_unchanged(ctx):
    from assay.propose.llm import request_seed

    with ScriptedLLMServer([answer(), answer()]) as server:
        make(server).translate(ctx, 1, random.Random(3))
        make(server, send_seed=False).translate(ctx, 1, random.Random(3))
        first, second = (r["json"] for r in server.requests)
    draw = random.Random(3).getrandbits(63)
    assert first["seed"] == request_seed(draw, 0) and "seed" not in second
