# Every configuration of the study for a few steps on a tiny GPT-2, plus one resume per
# strategy, before any run trains: a node that cannot run part of the study stops the
# pipeline in minutes, with the pass/fail matrix in logs/selftest.log.
rule selftest:
    output:
        gs.SELFTEST,
    params:
        command=gs.selftest_command(STUDY, PARAMS),
        settings=gs.preset_json(STUDY, "model", "train", "study"),
    log:
        "logs/selftest.log",
    threads: WHOLE_MACHINE
    resources:
        gpus=max(run.nproc for run in STUDY.runs) if STUDY.device == "cuda" else 0,
        gpu=max(run.nproc for run in STUDY.runs) if STUDY.device == "cuda" else 0,  # SLURM plugin
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
