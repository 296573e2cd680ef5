rule collect:
    input:
        records=[OUTPUTS[f"train@{run}"][0] for run in RUNS],
        metrics=[OUTPUTS[f"train@{run}"][1] for run in RUNS],
        meta=rules.prepare.output.meta,
        added=lambda wildcards: added_files(added_rounds_decided(ADDED.rounds)),  # none unless added_repeats.rounds
    output:
        metrics=f"{gs.RESULTS_DIR}/metrics.csv",
        runs=f"{gs.RESULTS_DIR}/runs.csv",
        summary=f"{gs.RESULTS_DIR}/summary.csv",
        summary_json=f"{gs.RESULTS_DIR}/summary.json",
        headline=[gs.headline_file(run) for run in CONFIGS.values()],
        loss_curves=f"{gs.RESULTS_DIR}/loss_curves.csv",
        link_model=f"{gs.RESULTS_DIR}/link_model.csv",
    params:
        command=gs.collect_command(STUDY, PARAMS),
        settings=gs.preset_json(STUDY, "study", "model"),
    log:
        "logs/collect.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
