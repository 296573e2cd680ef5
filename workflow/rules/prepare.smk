rule prepare:
    output:
        train=f"{layout.DATA_DIR}/train.bin",
        val=f"{layout.DATA_DIR}/val.bin",
        tokenizer=f"{layout.DATA_DIR}/tokenizer.json",
        meta=f"{layout.DATA_DIR}/meta.json",
    params:
        command=jobs.prepare_command(STUDY, PARAMS),
        settings=jobs.preset_json(STUDY, "data"),
    log:
        "logs/prepare.log",
    threads: WHOLE_MACHINE
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
