# gpt2dist: selftest, prepare -> train (one job per run id) -> collect -> plot -> report.
# `snakemake --cores all` runs the study of params.yaml's preset (auto: paper with CUDA
# GPUs, cpu without). Every rule calls the `gpt2dist` command that its DVC stage calls.
from snakemake.utils import min_version, validate

min_version("9.17")  # see pyproject.toml: earlier 9.x overlap whole-machine jobs


configfile: "params.yaml"


validate(config, "workflow/schemas/params.schema.json", set_default=False)


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/selftest.smk"
include: "workflow/rules/added.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/plot.smk"
include: "workflow/rules/report.smk"


# Seconds of CPU each: on a cluster they run on the submit host, not as jobs.
localrules:
    round_done,
    added_round,
    collect,
    plot,
    report,
    figures,


report: "workflow/report/workflow.rst"


# Before the first job, how long the study should take here (a calibration of a few steps), unless the study's
# estimate was written before (a tune's); each finished train job then prints the time left. A failed calibration
# costs the estimate, not the study.
onstart:
    try:
        if STUDY.preset.study.time_at_start:
            shell(jobs.estimate_command(STUDY, PARAMS))
    except subprocess.CalledProcessError:
        print("warning: no estimate of the study's duration (the error above); the study goes on", file=sys.stderr)


rule all:
    input:
        rules.report.output,
        rules.plot.output,
        rules.collect.output,
    default_target: True


# The tables, figures and findings from the runs on disk: after `dvc pull` (and `snakemake --touch`,
# since pulled files get new mtimes), this trains nothing. `dvc repro report` is the DVC equivalent.
rule figures:
    input:
        rules.report.output,
        rules.plot.output,
        rules.collect.output,
