rule verify:
    input:
        proposals=f"{C}/{{llm}}/{{task}}/gen_{{gen}}/proposals.json",
        baseline=f"{C}/baselines/{{task}}.json",
    output:
        f"{C}/{{llm}}/{{task}}/gen_{{gen}}/verdicts.json",
    conda:
        ENV
    log:
        f"{C}/logs/verify/{{llm}}/{{task}}/gen_{{gen}}.log",
    resources:
        gpu=GPU,
    shell:
        assay_step("verify", llm="{wildcards.llm}", task="{wildcards.task}", gen="{wildcards.gen}")
        + " > {log} 2>&1"
