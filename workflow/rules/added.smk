# Repeats added where the ranking is undecided (results/added_repeats.py): after the planned rounds, added round
# k ranks the runs so far and names the next repeats of the configurations still undecided and their
# placement's top; those are ordinary train jobs. A Snakemake checkpoint, so the DAG grows by what each round
# decides; with study.added_repeats.rounds 0 (the default) nothing asks for it. DVC trains the planned rounds only.
import json

ADDED = STUDY.preset.study.added_repeats


def added_run_ids(upto):
    """The runs added rounds 1 to `upto` named, each round decided first (until one names none)."""
    chosen = []
    for k in range(1, upto + 1):
        plan = json.loads(Path(checkpoints.added_round.get(k=k).output[0]).read_text())
        if not plan["runs"]:
            break
        chosen += plan["runs"]
    return chosen


def added_inputs(wildcards=None):
    """Every added round's plan and run record, for collect: the rounds until one adds nothing."""
    files = []
    for k in range(1, ADDED.rounds + 1):
        plan_file = checkpoints.added_round.get(k=k).output[0]
        files.append(plan_file)
        plan = json.loads(Path(plan_file).read_text())
        if not plan["runs"]:
            break
        files += [f"{gs.RUNS_DIR}/{run}/run.json" for run in plan["runs"]]
    return files


def run_of(run_id):
    """A planned run, or an added repeat of one of the study's configurations."""
    return RUNS.get(run_id) or gs.run_of(STUDY, run_id)


checkpoint added_round:
    input:
        [OUTPUTS[f"train@{run}"][0] for run in RUNS],
        lambda wildcards: [f"{gs.RUNS_DIR}/{run}/run.json" for run in added_run_ids(int(wildcards.k) - 1)],
        rules.prepare.output.meta,
    output:
        gs.added_round_file("{k}"),
    wildcard_constraints:
        k=r"\d+",
    params:
        command=lambda wildcards: gs.added_round_command(STUDY, int(wildcards.k), PARAMS),
        settings=gs.preset_json(STUDY, "study", "model"),
    log:
        "logs/added_round/{k}.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
