# Repeats added where the ranking is undecided (results/added_repeats.py): after the planned rounds, added round
# k ranks the runs so far and names the next repeats of the configurations still undecided and their
# placement's top; those are ordinary train jobs. A Snakemake checkpoint, so the DAG grows by what each round
# decides; with study.added_repeats.rounds 0 (the default) nothing asks for it. DVC trains the planned rounds only.
import json

ADDED = STUDY.preset.study.added_repeats


def added_rounds_decided(upto):
    """(plan file, the runs it names) of added rounds 1 to `upto`, each decided first, until one names none."""
    decided = []
    for k in range(1, upto + 1):
        plan_file = checkpoints.added_round.get(k=k).output[0]
        runs = json.loads(Path(plan_file).read_text())["runs"]
        decided.append((plan_file, runs))
        if not runs:
            break
    return decided


def added_records(decided):
    """The run records of the rounds `decided`."""
    return [f"{layout.RUNS_DIR}/{run}/run.json" for _, runs in decided for run in runs]


def added_files(decided):
    """The plans and run records of the rounds `decided`: what collect reads of them."""
    return [plan_file for plan_file, _ in decided] + added_records(decided)


def run_of(run_id):
    """A planned run, or an added repeat of one of the study's configurations."""
    return RUNS.get(run_id) or gs.run_of(STUDY, run_id)


checkpoint added_round:
    input:
        [OUTPUTS[f"train@{run}"][0] for run in RUNS],
        lambda wildcards: added_records(added_rounds_decided(int(wildcards.k) - 1)),
        rules.prepare.output.meta,
    output:
        layout.added_round_file("{k}"),
    wildcard_constraints:
        k=r"\d+",
    params:
        command=lambda wildcards: jobs.added_round_command(STUDY, int(wildcards.k), PARAMS),
        settings=jobs.preset_json(STUDY, "study", "model"),
    log:
        "logs/added_round/{k}.log",
    container:
        config["container"]
    shell:
        "{params.command} > {log} 2>&1"
