"""Evolution with real LLM plumbing: two litellm backends served by a scripted OpenAI-compatible
server on 127.0.0.1, through the real campaign DAG (Snakemake, every step a Hydra command) on
the cpu target.

The server answers from what each request asks (the operator, the parents named in the prompt,
the backend, and the request's ``seed``, which the proposer derives from the search's seeded
rng): translations are a compile error, a wrong kernel, an exploit and a good kernel; repairs
are fixed kernels; mutations and crossovers are new good kernels; stage 1 gets a correct
functional rewrite from one backend and a wrong one from the other.

The DAG test, in order (each part reuses the campaigns before it; one function so that
pytest-xdist never runs a campaign twice):
  A  the campaign with both backends (translation, then one generation of evolution): stage 1
     checked (A's rewrite accepted and shown in prompts, B's wrong one rejected); repairs fix
     compile errors; exploits never enter the population; crossover children carry both
     parents' ids; prompts carry the parent's code, verdict, timing and profile; `assay
     compare` ranks the backends; the notebook runs on it;
  B  the same campaign for one backend, killed with SIGKILL mid-way and resumed: the same
     candidates per generation as in A (answers replayed from the disk cache where the prompt
     is the same, asked again where it carries re-measured timings, and answered the same);
  C  a tiny token budget: the run stops asking, writes `stopped: budget`, and finishes.
A second, fast test stops an evolution step in the middle of its generation at the budget.

Speeds are made unambiguous so that selection does not depend on timing noise (A's kernels
make one pass over the data, B's 64, repairs 256): the resumed run makes the same choices.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import REPO  # noqa: E402
from helpers import env as campaign_env  # noqa: E402
from helpers import snakemake as dag  # noqa: E402
from llm_server import ScriptedLLMServer  # noqa: E402

TASK = "L1_1_ReLU"
GENS = 2  # generation 0 (translation) and 1 (evolution)
KEY_ENV = "ASSAY_LOOPBACK_KEY"
A, B = "loopa", "loopb"  # the two backends (config/llm/<name>.yaml written by the test)

# -- the kernels the scripted LLM writes ---------------------------------------------------------

KERNEL = '''import ctypes
import torch
import torch.nn as nn
from assay.bench.build import load_library

# variant: {marker}
CPP_SRC = r"""
// {backend}
#include <cstdint>
extern "C" void relu(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
    for (int r = 0; r < {reps}; ++r) {{
        {pragma}
        for (int64_t i = 0; i < n; ++i) y[i] = {expr};
        asm volatile("" ::: "memory");
    }}
}}
"""
_lib = load_library(CPP_SRC, lang="cpp")
_lib.relu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.relu.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{forward}
'''
FORWARD = '''        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.relu(x.data_ptr(), y.data_ptr(), x.numel())
        return y'''
CACHED_FORWARD = '''        key = tuple(x.shape)  # EXPLOIT: the first output, returned again
        if key not in self._seen:
            x = x.contiguous()
            y = torch.empty_like(x)
            _lib.relu(x.data_ptr(), y.data_ptr(), x.numel())
            self._seen[key] = y
        return self._seen[key]'''
LIBRARY_FORWARD = '''        return torch.relu(x)  # EXPLOIT: the library's kernel, not ours'''
RELU = "x[i] > 0.f ? x[i] : 0.f"


# OpenMP threads only for large inputs: the test's 8000 elements run on one thread, so timings
# do not depend on how loaded the two cores are. Speeds differ by the number of passes (reps):
# backend A writes one-pass kernels, backend B 64-pass ones, repairs are 256-pass (slowest).
PARALLEL = "#pragma omp parallel for simd schedule(static) if(n >= (1 << 22))"


def kernel(marker: str, backend: str, reps: int = 1, expr: str = RELU,
           forward: str = FORWARD, init: str = "") -> str:
    return KERNEL.format(marker=marker, backend=backend, reps=reps, expr=expr, forward=forward,
                         init=init, pragma=PARALLEL)


def answer(code: str, strategy: str) -> str:
    return (f"The op is memory bound; one pass over the data.\n\nStrategy: {strategy}\n\n"
            f"```python\n{code}```\n")


def functional(correct: bool) -> str:
    task = (REPO / "data/tasks/level1/1_ReLU.py").read_text()
    body = "torch.relu(x)" if correct else "torch.clamp(x, min=0.1)"
    text = task.replace("        return torch.relu(x)", "        return module_fn(x)")
    text = text.replace("class Model(", f"def module_fn(x: torch.Tensor) -> torch.Tensor:\n"
                                         f"    return {body}\n\n\nclass Model(")
    return f"```python\n{text}```\n"


# The translations, in request order per backend: [broken, exploit, good, good but slower].
REPS = {A: 1, B: 64}
TRANSLATIONS = {
    A: [answer(kernel("a-compile-error", A, expr="x[i] > 0.f ? x[i] : zero"), "vectorization"),
        answer(kernel("a-exploit-library", A, forward=LIBRARY_FORWARD), "other"),
        answer(kernel("a-good", A), "vectorization"),
        answer(kernel("a-good-slower", A, reps=128), "memory_layout")],
    B: [answer(kernel("b-wrong", B, reps=64, expr="x[i] > 0.f ? x[i] : 0.01f * x[i]"),
               "other"),
        answer(kernel("b-exploit-cached", B, reps=64, forward=CACHED_FORWARD,
                      init="        self._seen = {}\n"), "other"),
        answer(kernel("b-good", B, reps=64), "vectorization"),
        answer(kernel("b-good-slower", B, reps=128), "memory_layout")],
}
EXPLOIT_MARK = "EXPLOIT"


class Script:
    """The server's callable: an answer for each request, from what the request asks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.translations = Counter()
        self.asked: list[tuple[str, str, tuple[str, ...], int | None]] = []

    def reset(self) -> None:
        with self.lock:
            self.translations.clear()
            self.asked.clear()

    @staticmethod
    def operator(user: str) -> str:
        if "Rewrite this module into the functional form" in user:
            return "functional"
        if "# Broken candidate" in user:
            return "repair"
        if "verified candidates for this task" in user:
            return "crossover"
        if "# Current candidate" in user:
            return "mutate"
        return "translate"

    def __call__(self, request: dict) -> str:
        backend = request["model"]
        user = request["messages"][-1]["content"]
        seed = request.get("seed")
        op = self.operator(user)
        if op == "repair":
            parents = tuple(re.findall(r"^# Broken candidate (c[0-9a-f]{12})", user, re.M))
        elif op == "mutate":
            parents = tuple(re.findall(r"^# Current candidate (c[0-9a-f]{12})", user, re.M))
        elif op == "crossover":
            parents = tuple(sorted(re.findall(r"^## Candidate \d+: (c[0-9a-f]{12})", user,
                                              re.M)))
        else:
            parents = ()
        with self.lock:
            self.asked.append((backend, op, parents, seed))
            if op == "translate":
                i = self.translations[backend]
                self.translations[backend] += 1
        if op == "functional":
            return functional(correct=backend == A)
        if op == "translate":
            return TRANSLATIONS[backend][i % len(TRANSLATIONS[backend])]
        tag = f"{backend}-{op}-{'-'.join(parents)}-{seed}"
        if op == "repair":  # correct, and deliberately slow: it never outranks the others
            return answer(kernel(tag, backend, reps=256), "vectorization")
        strategy = "tiling" if op == "mutate" else "fusion"
        return answer(kernel(tag, backend, reps=REPS[backend]), strategy)


# -- running the DAG -----------------------------------------------------------------------------

OVERRIDES = [
    "tasks=ci", f"tasks.include=[{TASK}]", "evolve=ci", "target=cpu",
    "evolve.generations=1", "evolve.translate_n=4", "evolve.children=3",
    "evolve.population=4", "evolve.crossover_rate=0.5", "evolve.crossover_parents=2", "seed=0",
    "evolve.stage1_functional=true", "verify.budget_s=0.2", "verify.min_runs=5",
    "verify.warmup_s=0.02", "baselines.compile=false", "profile.ncu=off",
    "profile.clang_tidy=off",
]


def backend_config(name: str, url: str, price_in: float, price_out: float) -> str:
    return "\n".join([
        "defaults:", "  - schema", "  - _self_", f"name: {name}", "kind: litellm",
        f"model: openai/{name}", f"api_base: {url}", f"api_key_env: {KEY_ENV}",
        "temperature: 0.7", "max_tokens: 4096", "timeout_s: 60", "max_retries: 2",
        "concurrency: 1", f"input_cost_per_1k: {price_in}", f"output_cost_per_1k: {price_out}",
        ""])


def snakemake(work: Path, campaign: str, llms: list[str], *extra: str,
              target: str | None = None) -> list[str]:
    overrides = [f"campaign={campaign}", f"llms=[{','.join(llms)}]", *OVERRIDES, *extra]
    return dag(work, *([target] if target else []), overrides=overrides)


def run(world: dict, campaign: str, llms: list[str], *extra: str, target: str | None = None,
        timeout: float = 900):
    t0 = time.monotonic()
    cmd = snakemake(world["work"], campaign, llms, *extra, target=target)
    r = subprocess.run(cmd, capture_output=True,
                       text=True, env=world["env"], cwd=REPO, timeout=timeout)
    logs = world["work"] / "results" / campaign / "logs"
    assert r.returncode == 0, (r.stderr[-4000:] + _logs(logs))
    return time.monotonic() - t0


def _logs(logs: Path) -> str:
    out = []
    for p in sorted(logs.rglob("*.log")) if logs.exists() else []:
        text = p.read_text()
        if "Traceback" in text or "error" in text.lower():
            out.append(f"\n--- {p}\n{text[-2500:]}")
    return "".join(out)[-12000:]


@pytest.fixture
def world(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = Script()
    server = ScriptedLLMServer(script).start()
    confdir = tmp_path / "config"
    shutil.copytree(REPO / "config", confdir)
    (confdir / "llm" / f"{A}.yaml").write_text(backend_config(A, server.url, 0.5, 1.5))
    (confdir / "llm" / f"{B}.yaml").write_text(backend_config(B, server.url, 2.0, 6.0))
    env = campaign_env(ASSAY_CONFIG_DIR=str(confdir), OMP_NUM_THREADS="1",
                       **{KEY_ENV: "sk-loopback"})
    try:
        yield {"work": work, "server": server, "script": script, "env": env,
               "results": work / "results"}
    finally:
        server.close()


# -- reading the results tree --------------------------------------------------------------------

def generation(results: Path, campaign: str, llm: str, gen: int) -> dict:
    gdir = results / campaign / llm / TASK / f"gen_{gen}"
    props = json.loads((gdir / "proposals.json").read_text())
    cands = {}
    for cid in props["candidates"]:
        meta = json.loads((gdir / "candidates" / f"{cid}.json").read_text())
        vpath = gdir / "verdicts" / f"{cid}.json"
        verdict = json.loads(vpath.read_text()) if vpath.exists() else None
        code = (gdir / "candidates" / f"{cid}.py").read_text()
        cands[cid] = {"meta": meta, "verdict": verdict, "code": code}
    return {"proposals": props, "candidates": cands}


def ids_per_generation(results: Path, campaign: str, llm: str, gens: int = 2) -> list[set]:
    return [set(generation(results, campaign, llm, g)["proposals"]["candidates"])
            for g in range(gens)]


# -- the test --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_evolution_with_two_llm_backends(world):
    results, script, server = world["results"], world["script"], world["server"]
    timings = {}

    # ---- A: both backends, the whole DAG -------------------------------------------------
    timings["A"] = run(world, "llmtest", [A, B])
    check_stage1(results)
    for llm in (A, B):
        check_population(results, "llmtest", llm)
    check_prompts(server)
    check_compare(world)
    timings["notebook"] = check_notebook(world)
    asked_in_a = len(server.chat_requests)

    # ---- B and C at once (two campaigns, one core each) ---------------------------------------
    script.reset()
    t0 = time.monotonic()
    budget_run = start_budget_run(world)  # C: a tiny budget stops the run cleanly
    try:
        check_kill_and_resume(world)  # B: kill mid-way, resume; the same population as A
    finally:
        _, err = budget_run.communicate(timeout=900)
    timings["B+C"] = time.monotonic() - t0
    assert budget_run.returncode == 0, err[-4000:] + _logs(results / "llmbudget" / "logs")
    check_budget(world)
    # B's translations replayed from the disk cache: not asked again
    assert not [a for a in script.asked if a[1] == "translate"], script.asked
    assert len(server.chat_requests) > asked_in_a  # (mutations of re-timed parents were)
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


def check_stage1(results: Path) -> None:
    ra = json.loads((results / "llmtest" / A / TASK / "functional.json").read_text())
    rb = json.loads((results / "llmtest" / B / TASK / "functional.json").read_text())
    assert ra["accepted"] and ra["reasons"] == [], ra
    assert not rb["accepted"] and rb["reasons"] == ["same_outputs"], rb
    # its tokens count in generation 0's spend
    g0 = json.loads((results / "llmtest" / A / TASK / "gen_0" / "proposals.json").read_text())
    assert g0["functional"]["accepted"] and g0["tokens"] >= ra["tokens_in"] + ra["tokens_out"]


def check_population(results: Path, campaign: str, llm: str) -> None:
    gens = [generation(results, campaign, llm, g) for g in range(GENS)]
    cands = {cid: c for g in gens for cid, c in g["candidates"].items()}
    assert [len(g["candidates"]) for g in gens] == [4, 3], [g["proposals"] for g in gens]
    for cid, c in cands.items():
        assert c["verdict"] is not None, f"{cid} was never verified"
    by_mark = {re.search(r"# variant: (\S+)", c["code"]).group(1): cid
               for cid, c in cands.items()}

    # Exploits never enter the population: never accepted, never a parent except of a repair.
    exploits = {cid for cid, c in cands.items() if EXPLOIT_MARK in c["code"]}
    assert len(exploits) == 1, by_mark
    for cid in exploits:
        assert not cands[cid]["verdict"]["accepted"], cands[cid]["verdict"]["reasons"]
    for cid, c in cands.items():
        if set(c["meta"]["parents"]) & exploits:
            assert c["meta"]["operator"] == "repair", (cid, c["meta"])
    # ... nor does anything rejected: only repairs have a rejected parent
    for cid, c in cands.items():
        if c["meta"]["operator"] in ("mutate", "crossover"):
            assert all(cands[p]["verdict"]["accepted"] for p in c["meta"]["parents"]), cid

    # Repair: generation 1 fixes a broken kernel of generation 0, and the fix is accepted.
    kids = gens[1]["candidates"]
    repairs = [c for c in kids.values() if c["meta"]["operator"] == "repair"]
    assert len(repairs) == 1, kids
    [rep] = repairs
    parent = cands[rep["meta"]["parents"][0]]
    assert rep["verdict"]["accepted"], rep["verdict"]["reasons"]
    assert not parent["verdict"]["accepted"]
    if llm == A:  # the compile error, repaired: a child accepted whose parent failed `compiles`
        assert rep["meta"]["parents"] == [by_mark["a-compile-error"]]
        assert parent["verdict"]["reasons"][0] == "compiles"
        assert "zero" in parent["verdict"]["checks"]["compiles"]["detail"]

    # Crossover children carry both parents' ids (the two accepted translations).
    goods = {by_mark[f"{llm[-1]}-good"], by_mark[f"{llm[-1]}-good-slower"]}
    crosses = [c for c in kids.values() if c["meta"]["operator"] == "crossover"]
    assert crosses, kids
    for k in crosses:
        assert set(k["meta"]["parents"]) == goods, k["meta"]
        assert k["verdict"]["accepted"], k["verdict"]["reasons"]
    if llm == A:  # seed 0 draws one mutation (of the faster kernel) and one crossover for A
        assert sorted(c["meta"]["operator"] for c in kids.values()) == \
            ["crossover", "mutate", "repair"]
        [mut] = [c for c in kids.values() if c["meta"]["operator"] == "mutate"]
        assert mut["meta"]["parents"] == [by_mark["a-good"]] and mut["verdict"]["accepted"]
    # tokens, cost and the answering model were recorded per proposal
    assert all(c["meta"]["tokens_in"] > 0 and c["meta"]["cost_usd"] > 0 for c in cands.values())
    assert all(c["meta"]["model"] == f"openai/{llm}" for c in cands.values())


def check_prompts(server: ScriptedLLMServer) -> None:
    users = {}
    for r in server.chat_requests:
        body = r["json"]
        op = Script.operator(body["messages"][-1]["content"])
        users.setdefault((body["model"], op), []).append(body)
    # stage 1's accepted rewrite reaches A's translation prompt; B's rejected one does not
    [ta] = {json.dumps(b["messages"]) for b in users[(A, "translate")]}
    assert "def module_fn" in ta
    assert all("def module_fn" not in b["messages"][-1]["content"]
               for b in users[(B, "translate")])
    # mutation: the parent's code, verdict, timing and a profile summary
    for body in users[(A, "mutate")]:
        user = body["messages"][-1]["content"]
        assert "# variant: a-good" in user and "accepted: yes" in user
        assert re.search(r"runtime: [0-9.e-]+ ms", user) and "speedup:" in user
        assert "## Profile" in user and "measured by the verifier" in user
        assert "GB/s" in user
    # repair of the compile error: the compiler's log and the build-error guidance
    [rep] = users[(A, "repair")]
    user = rep["messages"][-1]["content"]
    assert "failed checks: compiles" in user and "zero" in user
    assert "did not build" in user
    # repair of the wrong kernel (B): the correctness detail
    for body in users.get((B, "repair"), []):
        assert "failed checks:" in body["messages"][-1]["content"]
    # every request carried a seed from the search's rng
    assert all(isinstance(r["json"].get("seed"), int) for r in server.chat_requests)


def check_compare(world: dict) -> None:
    r = subprocess.run([sys.executable, "-m", "assay.cli", "compare", "llmtest", "--results",
                        str(world["results"])], capture_output=True, text=True,
                       env=world["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if A in line or B in line]
    assert [A in rows[0], B in rows[1]] == [True, True], r.stdout
    from assay.layout import Campaign
    from assay.report.compare import compare_table

    table = compare_table([Campaign(world["results"] / "llmtest")])
    assert table["llm"].to_list() == [A, B], table
    assert table["accepted"].to_list() == [1, 1]
    assert all(t > 0 for t in table["tokens"].to_list())
    assert all(c > 0 for c in table["cost_usd"].to_list())


def check_notebook(world: dict) -> float:
    import nbformat
    from nbclient import NotebookClient

    t0 = time.monotonic()
    nb = nbformat.read(REPO / "notebooks" / "compare_llms.ipynb", as_version=4)
    old = dict(os.environ)
    os.environ.update({"ASSAY_RESULTS": str(world["results"]), "ASSAY_CAMPAIGN": "llmtest",
                       "ASSAY_MLFLOW_DB": str(world["results"] / "mlflow.db")})
    try:
        NotebookClient(nb, timeout=240, kernel_name="python3",
                       resources={"metadata": {"path": str(world["work"])}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    text = "\n".join(out.get("text", "") + json.dumps(out.get("data", {}))
                     for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []))
    assert A in text and B in text
    assert "<svg" in text  # the plot
    assert "source: mlflow" in text and "best_speedup_eager" in text  # per generation
    return time.monotonic() - t0


def check_kill_and_resume(world: dict) -> None:
    results = world["results"]
    gdir = results / "llmresume" / A / TASK
    final = str(Path("results") / "llmresume" / A / TASK / f"gen_{GENS - 1}" / "verdicts.json")
    cmd = snakemake(world["work"], "llmresume", [A], target=final)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=world["env"], cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 900
    try:
        # Kill once the last generation is being verified: translation, verification of
        # generation 0 and the evolution step are done, some verdicts are still to come.
        while time.monotonic() < deadline and proc.poll() is None:
            if list((gdir / f"gen_{GENS - 1}" / "verdicts").glob("*.json")):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (gdir / f"gen_{GENS - 1}" / "verdicts.json").exists()
    # What the killed run had done: its verdicts, and the last generation's proposals (written
    # before its verification started). Resuming redoes none of it.
    before = {p: p.read_bytes() for p in [*gdir.glob("gen_*/verdicts/*.json"),
                                           *gdir.glob("gen_*/proposals.json"),
                                           *gdir.glob("gen_*/candidates/*")]}
    assert gdir / f"gen_{GENS - 1}" / "proposals.json" in before
    run(world, "llmresume", [A], target=final)
    for p, data in before.items():
        assert p.read_bytes() == data, f"{p} was redone on resume"
    # The search is a function of the verdicts: check_population finds generation 0 ranked as
    # in the uninterrupted run (the mutation's parent is the faster translation, whose loop runs
    # once to the other's 128 times: a loaded machine does not swap them), so generation 1 is
    # the same.
    check_population(results, "llmresume", A)
    assert ids_per_generation(results, "llmresume", A) == \
        ids_per_generation(results, "llmtest", A)


def start_budget_run(world: dict) -> subprocess.Popen:
    """A second run with a one-token budget: stage 1's request goes out (nothing was spent
    before it), then the campaign stops asking: translation and evolution write empty
    generations noted `stopped: budget`, and the run finishes normally. (Stopping in the middle
    of a generation: the fast test below.)"""
    return subprocess.Popen(snakemake(world["work"], "llmbudget", [A], "llm.budget_tokens=1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=world["env"], cwd=REPO)


def check_budget(world: dict) -> None:
    c = world["results"] / "llmbudget"
    func = json.loads((c / A / TASK / "functional.json").read_text())
    spent_stage1 = func["tokens_in"] + func["tokens_out"]
    gens = [json.loads((c / A / TASK / f"gen_{g}" / "proposals.json").read_text())
            for g in range(GENS)]
    assert gens[0]["functional"]["accepted"] and gens[0]["tokens"] == spent_stage1 > 1
    for g in gens:
        assert g["stopped"] == "budget" and g["candidates"] == [], g
        assert g["budget"]["cap_tokens"] == 1
    assert gens[1]["tokens"] == 0 and gens[1]["budget"]["spent_before_tokens"] == spent_stage1
    # ... and the campaign finished normally: verdicts, profile, tracking, archive, report
    for g in range(GENS):
        assert json.loads((c / A / TASK / f"gen_{g}" / "verdicts.json").read_text())[
            "candidates"] == []
    assert (c / A / TASK / "profile.json").exists()
    assert (c / A / "tracked.json").exists() and (c / "report.html").exists()


# -- the budget inside one evolution step (no DAG: a results tree made by hand) -----------------

def test_evolve_step_stops_mid_generation_at_the_budget(tmp_path, monkeypatch):
    from assay.app import compose
    from assay.steps.evolve import evolve
    from assay.layout import Campaign, write_json

    script = Script()
    with ScriptedLLMServer(script) as server:
        confdir = tmp_path / "config"
        shutil.copytree(REPO / "config", confdir)
        (confdir / "llm" / f"{A}.yaml").write_text(backend_config(A, server.url, 0.5, 1.5))
        monkeypatch.setenv("ASSAY_CONFIG_DIR", str(confdir))
        monkeypatch.setenv(KEY_ENV, "sk-loopback")
        results = tmp_path / "results"
        c = Campaign.at(results, "unit")
        write_json(c.task_record(TASK), {"id": TASK, "level": 1, "error": None})
        good = kernel("u-good", A)
        broken = kernel("u-broken", A, expr="x[i] > 0.f ? x[i] : zero")
        from assay.records import Proposal

        ids = []
        for code, verdict, strategy in (
                (good, {"accepted": True, "speedup_eager": 1.5, "runtime_ms": 0.01,
                        "rel_err": 0.0, "reasons": [], "checks": {}}, "vectorization"),
                (broken, {"accepted": False, "reasons": ["compiles"], "checks": {
                    "compiles": {"passed": False, "detail": "error: 'zero' was not declared"}}},
                 "other")):
            p = Proposal(code=code, strategy=strategy, tokens_in=40, tokens_out=10)
            (c.candidate(A, TASK, 0, p.id)).parent.mkdir(parents=True, exist_ok=True)
            c.candidate(A, TASK, 0, p.id).write_text(code)
            write_json(c.proposal_meta(A, TASK, 0, p.id), p.meta(0, A, TASK))
            write_json(c.verdict(A, TASK, 0, p.id), {**verdict, "candidate": p.id})
            ids.append(p.id)
        write_json(c.proposals(A, TASK, 0), {"generation": 0, "candidates": ids,
                                             "tokens": 100, "cost_usd": 0.1})
        overrides = [f"results_dir={results}", "campaign=unit", f"llm={A}", f"task={TASK}",
                     "gen=1", "tasks=ci", f"tasks.include=[{TASK}]", "target=cpu",
                     "evolve.children=3", "evolve.crossover_rate=0.0",
                     "llm.budget_tokens=150"]
        summary = evolve(compose(overrides))
        # spent before: 100 < 150, so the first operation (the repair) asks; then the cap is
        # reached and the other two operations are not asked for
        assert [a[1] for a in script.asked] == ["repair"]
        assert summary["stopped"] == "budget" and len(summary["candidates"]) == 1
        assert summary["budget"]["spent_before_tokens"] == 100
        assert summary["budget"]["spent_after_tokens"] == 100 + summary["tokens"] > 150
        on_disk = json.loads(c.proposals(A, TASK, 1).read_text())
        assert on_disk == json.loads(json.dumps(summary))
        # a rerun of the step (a resume) decides the same from the files, replaying the cache
        again = evolve(compose(overrides))
        assert again["candidates"] == summary["candidates"] and len(script.asked) == 1
        # the next generation: over the cap before it starts, so nothing is asked at all
        write_json(c.verdict(A, TASK, 1, summary["candidates"][0]),
                   {"accepted": True, "speedup_eager": 0.1, "rel_err": 0.0, "reasons": [],
                    "checks": {}})
        nxt = evolve(compose([o.replace("gen=1", "gen=2") for o in overrides]))
        assert nxt["stopped"] == "budget" and nxt["candidates"] == [] and len(script.asked) == 1
