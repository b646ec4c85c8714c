# The population: every earlier generation's candidates and verdicts (verify writes the
# per-candidate verdicts/ beside its verdicts.json). Reads the stepping stones as translate does.
rule evolve:
    input:
        verdicts=lambda w: f"{C}/{w.llm}/{w.task}/gen_{int(w.gen) - 1}/verdicts.json",
        candidates=lambda w: [
            f"{C}/{w.llm}/{w.task}/gen_{g}/candidates" for g in range(int(w.gen))
        ],
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
