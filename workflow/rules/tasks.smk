rule extract:
    output:
        f"{C}/tasks/{{task}}.json",
    conda:
        ENV
    log:
        f"{C}/logs/extract/{{task}}.log",
    resources:
        gpu=GPU,
    shell:
        assay_step("tasks", task="{wildcards.task}") + " > {log} 2>&1"


rule baseline:
    input:
        f"{C}/tasks/{{task}}.json",
    output:
        f"{C}/baselines/{{task}}.json",
    conda:
        ENV
    log:
        f"{C}/logs/baseline/{{task}}.log",
    resources:
        gpu=GPU,
    shell:
        assay_step("bench", task="{wildcards.task}") + " > {log} 2>&1"
