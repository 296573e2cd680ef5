rule report:
    input:
        summary=rules.collect.output.summary_json,
        figures=rules.plot.output,
    output:
        summary=report(f"{layout.RESULTS_DIR}/summary.md", caption="../report/summary.rst", category="Summary"),
        findings=report(f"{layout.RESULTS_DIR}/findings.md", caption="../report/findings.rst", category="Summary"),
    params:
        command=jobs.report_command(),
    log:
        "logs/report.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
