rule prepare:
    output:
        train=f"{gs.DATA_DIR}/train.bin",
        val=f"{gs.DATA_DIR}/val.bin",
        tokenizer=f"{gs.DATA_DIR}/tokenizer.json",
        meta=f"{gs.DATA_DIR}/meta.json",
    params:
        command=gs.prepare_command(STUDY, PARAMS),
        settings=gs.preset_json(STUDY, "data"),
    log:
        "logs/prepare.log",
    threads: WHOLE_MACHINE
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
