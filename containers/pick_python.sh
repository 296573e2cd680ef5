#!/usr/bin/env bash
# Print the Python that setup_env.sh makes .venv with where PYTHON names none: of `python3` and the system's own
# (PYTHON_CANDIDATES lists others), the one that runs Python faster. They can differ by a third: a Python built with
# a shared libpython, as pyenv builds it, runs the same bytecode slower than a distribution's statically linked one,
# and the tests and the study spend most of their CPU time running Python (importing torch, Snakemake, pytest). A
# candidate must be 3.10 or newer, make venvs with pip and have its headers (Horovod compiles against them); the
# probe is a loop of dict, string and dataclass work, the best of five in CPU time. What each took goes to stderr.
set -euo pipefail
candidates=${PYTHON_CANDIDATES:-python3 /usr/bin/python3}
best="" best_s="" seen=" "
for candidate in $candidates; do
  where=$(command -v "$candidate") || continue
  where=$(readlink -f "$where")
  [[ $seen == *" $where "* ]] && continue  # the same file under two names
  seen+="$where "
  probe=$("$candidate" - 2>/dev/null <<'PROBE'
import dataclasses, ensurepip, sys, sysconfig, time, venv  # noqa: F401  (a venv with pip needs both)
from pathlib import Path


def work():
    classes = [dataclasses.make_dataclass(f"C{i}", [("a", int), ("b", str, "x")]) for i in range(60)]
    table = {}
    for i in range(60_000):
        table[str(i)] = classes[i % 60](i).a + len(table)


assert sys.version_info >= (3, 10) and Path(sysconfig.get_paths()["include"], "Python.h").is_file()
best = float("inf")
for _ in range(5):
    started = time.process_time()
    work()
    best = min(best, time.process_time() - started)
print(f"{best:.3f} {Path(sys.executable).resolve()} {sys.version.split()[0]}")
PROBE
) || continue
  read -r seconds path version <<<"$probe"
  echo "pick_python: $candidate is Python $version ($path): ${seconds} s on the probe" >&2
  if [[ -z $best ]] || awk "BEGIN { exit !($seconds < $best_s) }"; then best=$candidate best_s=$seconds; fi
done
if [[ -z $best ]]; then
  echo "error: no Python 3.10 or newer with venv, pip and its headers among: $candidates; install one, or name it in PYTHON" >&2
  exit 1
fi
echo "$best"
