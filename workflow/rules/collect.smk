rule collect:
    input:
        records=[OUTPUTS[f"train@{run}"][0] for run in RUNS],
        metrics=[OUTPUTS[f"train@{run}"][1] for run in RUNS],
        meta=rules.prepare.output.meta,
        added=lambda wildcards: added_files(added_rounds_decided(ADDED.rounds)),  # none unless added_repeats.rounds
    output:
        metrics=f"{layout.RESULTS_DIR}/metrics.csv",
        runs=f"{layout.RESULTS_DIR}/runs.csv",
        summary=f"{layout.RESULTS_DIR}/summary.csv",
        summary_json=f"{layout.RESULTS_DIR}/summary.json",
        headline=[layout.headline_file(run) for run in CONFIGS.values()],
        loss_curves=f"{layout.RESULTS_DIR}/loss_curves.csv",
        link_model=f"{layout.RESULTS_DIR}/link_model.csv",
        traces=report(directory(f"{layout.RESULTS_DIR}/{layout.TRACES_DIR}"), patterns=["{config}.rank{rank}.json.gz"],
                      caption="../report/traces.rst", category="Traces"),
    params:
        command=jobs.collect_command(STUDY, PARAMS),
        settings=jobs.preset_json(STUDY, "study", "model"),
    log:
        "logs/collect.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
