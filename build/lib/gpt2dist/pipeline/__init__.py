"""Pipeline: the study's run matrix and the exact stage commands that Snakemake and DVC both run.
May import config and the shared ground only."""
