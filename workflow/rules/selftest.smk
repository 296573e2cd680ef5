# One job per configuration of the study, a few steps on a tiny GPT-2 (and a kill-and-resume for
# one configuration per strategy), before that configuration's runs train: a node that cannot
# run part of the study stops the pipeline in minutes, with the error line in logs/selftest/.
# Per configuration, not one job for the whole matrix: adding a configuration to the study
# checks only the new one, and the runs already trained stay valid (a single selftest job
# would re-run, and every train job after it; `ancient` cannot help, as Snakemake then skips
# the train jobs' own params check: snakemake/snakemake#4166).
rule selftest:
    output:
        f"{layout.SELFTEST_DIR}/{{config}}.json",
    wildcard_constraints:
        config="|".join(map(re.escape, CONFIGS)),
    params:
        command=lambda wildcards: jobs.selftest_command(STUDY, CONFIGS[wildcards.config], PARAMS),
        settings=jobs.preset_json(STUDY, "model", "train"),
    log:
        "logs/selftest/{config}.log",
    # On CPUs, a core per process: selftests measure nothing, so two one-process ones share a 2-core
    # machine (they hold the machine lock shared; a train job takes it whole). On GPUs, one at a time:
    # clusters often run GPUs in exclusive-process mode.
    threads: lambda wildcards: STUDY.processes(CONFIGS[wildcards.config]) if STUDY.device == "cpu" else WHOLE_MACHINE
    priority: 10  # before any train job that is ready at the same time
    resources:
        gpus=lambda wildcards: CONFIGS[wildcards.config].nproc if STUDY.device == "cuda" else 0,
        # on a SLURM cluster: what its configuration's train jobs ask for, so its checks start as they will
        **slurm_resources(lambda wildcards: CONFIGS[wildcards.config]),
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
