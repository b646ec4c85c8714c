rule extract:
    output:
        f"{C}/tasks/{{task}}.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/extract/{{task}}.log",
    resources:
        gpu=GPU,
    shell:
        assay_step("extract", task="{wildcards.task}") + " > {log} 2>&1"


# The device's measured peaks (roofline, the parents' measured profiles): one file per
# campaign, written once, read by translate, evolve, verify, export and report.
rule device:
    output:
        f"{C}/device.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/device.log",
    threads: TIMING_THREADS
    resources:
        gpu=GPU,
        cpu_timing=CPU_TIMING,
    shell:
        assay_step("device") + " > {log} 2>&1"


# Written once per campaign: every verdict's speedup is computed against it. A forced re-time
# (`--forcerun baseline`) makes the task's verdicts stale, and verify judges them again.
rule baseline:
    input:
        f"{C}/tasks/{{task}}.json",
    output:
        f"{C}/baselines/{{task}}.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/baseline/{{task}}.log",
    threads: TIMING_THREADS
    resources:
        gpu=GPU,
        cpu_timing=CPU_TIMING,
    shell:
        assay_step("baseline", task="{wildcards.task}") + " > {log} 2>&1"
