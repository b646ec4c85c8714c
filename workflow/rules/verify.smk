# Writes gen_<g>/verdicts/<cid>.json too, one per candidate as it is decided; they are not
# declared outputs because Snakemake would delete them before a resumed run. A verdict older
# than the generation's proposals or the task's baseline is stale and judged again.
rule verify:
    input:
        proposals=f"{C}/{{llm}}/{{task}}/gen_{{gen}}/proposals.json",
        candidates=f"{C}/{{llm}}/{{task}}/gen_{{gen}}/candidates",
        baseline=f"{C}/baselines/{{task}}.json",
        record=f"{C}/tasks/{{task}}.json",
        device=f"{C}/device.json",
    output:
        f"{C}/{{llm}}/{{task}}/gen_{{gen}}/verdicts.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/verify/{{llm}}/{{task}}/gen_{{gen}}.log",
    threads: TIMING_THREADS
    resources:
        gpu=GPU,
        cpu_timing=CPU_TIMING,
    shell:
        assay_step("verify", llm="{wildcards.llm}", task="{wildcards.task}", gen="{wildcards.gen}")
        + " > {log} 2>&1"
