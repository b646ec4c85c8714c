# The population: every earlier generation's candidates and verdicts (verify writes the
# per-candidate verdicts/ beside its verdicts.json). Reads the stepping stones and the budget's
# spend as translate does.
rule evolve:
    input:
        earlier=lambda w: generations(w.llm, w.task, range(int(w.gen))),
        record=f"{C}/tasks/{{task}}.json",
        device=f"{C}/device.json",
    output:
        proposals=f"{C}/{{llm}}/{{task}}/gen_{{gen}}/proposals.json",
        candidates=directory(f"{C}/{{llm}}/{{task}}/gen_{{gen}}/candidates"),
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
