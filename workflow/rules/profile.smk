# Profiles the best accepted kernel of all the generations.
rule profile:
    input:
        generations=lambda w: generations(w.llm, w.task, range(GENS + 1)),
        record=f"{C}/tasks/{{task}}.json",
    output:
        f"{C}/{{llm}}/{{task}}/profile.json",
    params:
        overrides=OVR,
    conda:
        ENV
    log:
        f"{C}/logs/profile/{{llm}}/{{task}}.log",
    threads: TIMING_THREADS
    resources:
        gpu=GPU,
        cpu_timing=CPU_TIMING,
    shell:
        assay_step("profile", llm="{wildcards.llm}", task="{wildcards.task}") + " > {log} 2>&1"
