rule track:
    input:
        expand(f"{C}/{{{{llm}}}}/{{task}}/profile.json", task=TASKS),
    output:
        f"{C}/{{llm}}/tracked.json",
    conda:
        ENV
    log:
        f"{C}/logs/track/{{llm}}.log",
    shell:
        assay_step("track", llm="{wildcards.llm}") + " > {log} 2>&1"


rule export:
    input:
        expand(f"{C}/{{llm}}/{{task}}/profile.json", llm=LLMS, task=TASKS),
    output:
        expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        f"{C}/archive/README.md",
    conda:
        ENV
    log:
        f"{C}/logs/export.log",
    shell:
        assay_step("archive") + " > {log} 2>&1"
