rule profile:
    input:
        f"{C}/{{llm}}/{{task}}/gen_{GENS}/verdicts.json",
    output:
        f"{C}/{{llm}}/{{task}}/profile.json",
    conda:
        ENV
    log:
        f"{C}/logs/profile/{{llm}}/{{task}}.log",
    resources:
        gpu=GPU,
    shell:
        assay_step("profile", llm="{wildcards.llm}", task="{wildcards.task}") + " > {log} 2>&1"
