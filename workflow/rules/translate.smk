rule translate:
    input:
        f"{C}/tasks/{{task}}.json",
    output:
        f"{C}/{{llm}}/{{task}}/gen_0/proposals.json",
    conda:
        ENV
    log:
        f"{C}/logs/translate/{{llm}}/{{task}}.log",
    shell:
        assay_step("propose", llm="{wildcards.llm}", task="{wildcards.task}") + " > {log} 2>&1"
