rule evolve:
    input:
        verdicts=lambda w: f"{C}/{w.llm}/{w.task}/gen_{int(w.gen) - 1}/verdicts.json",
        record=f"{C}/tasks/{{task}}.json",
        device=f"{C}/device.json",
    output:
        f"{C}/{{llm}}/{{task}}/gen_{{gen}}/proposals.json",
    params:
        overrides=OVR,
    wildcard_constraints:
        gen=r"[1-9]\d*",
    conda:
        ENV
    log:
        f"{C}/logs/evolve/{{llm}}/{{task}}/gen_{{gen}}.log",
    shell:
        assay_step("evolve", llm="{wildcards.llm}", task="{wildcards.task}", gen="{wildcards.gen}")
        + " > {log} 2>&1"
