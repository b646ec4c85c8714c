# Also reads, outside the DAG: the LLM answer cache (results/.llm-cache), the budget's spend
# (the backend's other proposals.json) and the stepping stones of earlier campaigns.
rule translate:
    input:
        record=f"{C}/tasks/{{task}}.json",
        device=f"{C}/device.json",
    output:
        f"{C}/{{llm}}/{{task}}/gen_0/proposals.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/translate/{{llm}}/{{task}}.log",
    shell:
        assay_step("propose", llm="{wildcards.llm}", task="{wildcards.task}") + " > {log} 2>&1"
