# Also reads, outside the DAG: the LLM answer cache (results/.llm-cache), the budget's spend
# (the backend's other proposals.json) and the stepping stones (the best verdicts of the
# level's other tasks, in this campaign and earlier ones, as found when the generation starts;
# recorded in gen_<g>/stones.json, which a rerun reuses). Also writes gen_0/stones.json and,
# with stage 1, <llm>/<task>/functional.{py,json} (kept by a rerun: cached work).
rule translate:
    input:
        record=f"{C}/tasks/{{task}}.json",
        device=f"{C}/device.json",
    output:
        proposals=f"{C}/{{llm}}/{{task}}/gen_0/proposals.json",
        candidates=directory(f"{C}/{{llm}}/{{task}}/gen_0/candidates"),
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/translate/{{llm}}/{{task}}.log",
    shell:
        assay_step("translate", llm="{wildcards.llm}", task="{wildcards.task}") + " > {log} 2>&1"
