rule report:
    input:
        archive=expand(f"{C}/archive/level_{{level}}.parquet", level=LEVELS),
        tracked=expand(f"{C}/{{llm}}/tracked.json", llm=LLMS),
    output:
        f"{C}/report.html",
    conda:
        ENV
    log:
        f"{C}/logs/report.log",
    shell:
        assay_step("report") + " > {log} 2>&1"
