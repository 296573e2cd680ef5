rule plot:
    input:
        rules.collect.output,
    output:
        **{
            name: report(
                f"{gs.RESULTS_DIR}/figures/{name}.png",
                caption=f"../report/{name}.rst",
                category="Figures",
            )
            for name in gs.FIGURES
        },
        svg=[f"{gs.RESULTS_DIR}/figures/{name}.svg" for name in gs.FIGURES],
    params:
        command=gs.plot_command(),
    log:
        "logs/plot.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
