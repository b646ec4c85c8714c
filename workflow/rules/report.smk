# Reads the results tree as export does (and the campaigns of report.compare_with, finished
# ones, outside this DAG).
rule report:
    input:
        archive=expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        tracked=expand(f"{C}/{{llm}}/tracked.json", llm=LLMS),
        tracked_tasks=expand(f"{C}/{{llm}}/{{task}}/tracked.json", llm=LLMS, task=TASKS),
        profiles=expand(f"{C}/{{llm}}/{{task}}/profile.json", llm=LLMS, task=TASKS),
        generations=every_generation(LLMS),
        records=expand(f"{C}/tasks/{{task}}.json", task=TASKS),
        baselines=expand(f"{C}/baselines/{{task}}.json", task=TASKS),
        device=f"{C}/device.json",
    output:
        f"{C}/report.html",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/report.log",
    shell:
        assay_step("report") + " > {log} 2>&1"
