rule plot:
    input:
        rules.collect.output,
    output:
        **{
            name: report(
                f"{layout.RESULTS_DIR}/figures/{name}.png",
                caption=f"../report/{name}.rst",
                category="Figures",
            )
            for name in jobs.figures(STUDY)
        },
        svg=[f"{layout.RESULTS_DIR}/figures/{name}.svg" for name in jobs.figures(STUDY)],
    params:
        command=jobs.plot_command(),
        # for the report's captions (Jinja2 in workflow/report/*.rst): fixed by the plan, so they
        # never make plot out of date on their own
        study=jobs.caption_facts(STUDY),
    log:
        "logs/plot.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
