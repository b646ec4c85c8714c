# Also writes, outside the campaign folder: the MLflow store (mlflow.tracking_uri), shared by
# every campaign and backend.
rule track:
    input:
        profiles=expand(f"{C}/{{{{llm}}}}/{{task}}/profile.json", task=TASKS),
        generations=lambda w: every_generation([w.llm]),
        records=expand(f"{C}/tasks/{{task}}.json", task=TASKS),
        baselines=expand(f"{C}/baselines/{{task}}.json", task=TASKS),
    output:
        backend=f"{C}/{{llm}}/tracked.json",
        tasks=expand(f"{C}/{{{{llm}}}}/{{task}}/tracked.json", task=TASKS),
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/track/{{llm}}.log",
    shell:
        assay_step("track", llm="{wildcards.llm}") + " > {log} 2>&1"


rule export:
    input:
        profiles=expand(f"{C}/{{llm}}/{{task}}/profile.json", llm=LLMS, task=TASKS),
        generations=every_generation(LLMS),
        records=expand(f"{C}/tasks/{{task}}.json", task=TASKS),
        baselines=expand(f"{C}/baselines/{{task}}.json", task=TASKS),
        device=f"{C}/device.json",
    output:
        expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        f"{C}/archive/README.md",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/export.log",
    shell:
        assay_step("export") + " > {log} 2>&1"
