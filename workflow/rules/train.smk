# Runs across a cluster's nodes start their ranks with srun, which an image that `--sdm apptainer` runs a job
# in does not have: under it, such a job runs on the host (rule train_across_nodes, below) and srun starts each
# task inside the image (GPT2DIST_IMAGE; launch/slurm.py). Emulated nodes live on this machine and need no srun.
IN_IMAGE = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method


# One job per run id. checkpoint.pt is deliberately not an output: Snakemake deletes an
# interrupted job's outputs (--rerun-incomplete, retries), and the re-run must find the
# checkpoint to resume from; the metrics so far travel inside it (the final checkpoint the study keeps moves into
# kept/ once the run has completed). Each job takes every core of the machine so that no two runs share
# it: throughput numbers from overlapping runs would not be comparable. `gpus` lets
# `--resources gpus=N` (or the SLURM executor) account for devices.
rule train:
    input:
        rules.prepare.output,
        # its configuration's selftest must pass first (where the preset has selftests)
        lambda wildcards: jobs.selftest_inputs(STUDY, run_of(wildcards.run)),
        # Repeats interleave: repeat k waits for round k-1 (rule round_done below), so a slow spell
        # of the machine hits all configurations alike. Order only: ancient() keeps a re-trained
        # earlier repeat from making every later one out of date.
        lambda wildcards: [ancient(layout.round_marker(r)) for r in jobs.previous_rounds(run_of(wildcards.run))],
        # made when the run's last attempt did not complete (common.smk): newer than its outputs, so re-run
        lambda wildcards: [marker] if Path(marker := layout.retry_marker(wildcards.run)).exists() else [],
    output:
        record=RUN_OUTPUTS["record"],
        metrics=RUN_OUTPUTS["metrics"],
        spec=RUN_OUTPUTS["spec"],
        events=RUN_OUTPUTS["events"],  # TensorBoard's
        # each rank's trace and, where study.keep_checkpoints keeps it, the final checkpoint: a directory, as a run
        # resumed past its traced steps keeps no trace (and one that failed, no checkpoint)
        kept=directory(RUN_OUTPUTS["kept"]),
    wildcard_constraints:
        run=run_pattern(across_nodes=False),
    params:
        command=lambda wildcards: jobs.train_command(STUDY, run_of(wildcards.run)),
        image=lambda wildcards: f"GPT2DIST_IMAGE={shlex.quote(config['container'])} "
        if IN_IMAGE and wildcards.run in ACROSS_NODES
        else "",
        settings=jobs.preset_json(STUDY, "model", "train"),
        progress=jobs.progress_command(STUDY, PARAMS),
    log:
        "logs/train/{run}.log",
    threads: WHOLE_MACHINE
    resources:
        gpus=lambda wildcards: run_of(wildcards.run).nproc if STUDY.device == "cuda" else 0,  # --resources gpus=N
        # On a SLURM cluster (jobs.slurm_request): nodes, one task per process and each node's GPUs;
        # tasks_per_gpu=0 keeps the plugin from adding --ntasks-per-gpu.
        **slurm_resources(lambda wildcards: run_of(wildcards.run)),
        tasks_per_gpu=0,
        runtime=STUDY.preset.study.train_runtime_min,  # minutes
        retries_left=lambda wildcards, attempt: TRAIN_RETRIES + 1 - attempt,
    # A run whose process crashed (a rank killed, a segfault) is trained again in the same call, resuming from its
    # checkpoint where it has one (Snakemake deletes the failed attempt's outputs, never checkpoint.pt).
    retries: TRAIN_RETRIES
    container:
        config["container"]
    # A run that fails again does not stop the study: its run.json says so, with the error's line, collect,
    # plot and report name it, and the next `snakemake` retries it alone. Without a record (bad input, found
    # before training starts) the job fails. The time left is no reason to drop a run.
    shell:
        "{params.image}{params.command} > {log} 2>&1 || {{ test -s {output.record} && test {resources.retries_left} -eq 0; }}; "
        "{params.progress} || true"


# Its software is the image's either way: without --sdm apptainer the directive starts nothing (as for train's);
# under it, the job starts on the host and srun puts each task in the image.
use rule train as train_across_nodes with:
    wildcard_constraints:
        run=run_pattern(across_nodes=True),
    container:
        None if IN_IMAGE else config["container"]


# Order only, no command: marks that every configuration's repeat {round} has trained. Through one
# marker per round, not a dependency on each run: adding a configuration to the study then leaves
# the set of inputs of every later repeat unchanged, and Snakemake re-trains none of them.
rule round_done:
    input:
        lambda wildcards: [OUTPUTS[f"train@{run.run_id}"][0] for run in STUDY.runs if run.repeat == int(wildcards.round)],
    output:
        touch(layout.round_marker("{round}")),
    wildcard_constraints:
        round=r"\d+",
