"""Entry point of one training rank: `python -m gpt2dist.launch.worker SPEC_JSON`, or this file run in a
rank that torchrun forked (forking_torchrun)."""

from __future__ import annotations

import faulthandler
import multiprocessing
import sys
from pathlib import Path

from gpt2dist.launch import lifetime

with lifetime.importing_without_collection():  # a rank started as a fresh interpreter (srun, horovodrun, GPUs)
    import torch._dynamo  # noqa: F401  (torch's optimizers import it at their first step)

    from gpt2dist.config.schema import read_spec
    from gpt2dist.errors import UsageError, error_line
    from gpt2dist.launch import locks
    from gpt2dist.logs import setup_logging
    from gpt2dist.training import loop, stops
    from gpt2dist.training.run_record import Outcome, finish_record


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpt2dist.launch.worker SPEC_JSON", file=sys.stderr)
        return 2
    setup_logging()
    faulthandler.enable()  # a rank that dies of SIGSEGV or SIGABRT prints its Python stack into the run's log
    try:
        lifetime.stop_on_signals()  # may stop at once: the launcher can be gone already
        spec = read_spec(Path(args[0]))
        with locks.hold_as_rank(Path(spec.out_dir)):
            reported = loop.run(spec)
        if spec.attempt is None and reported:  # started by hand: no launcher writes the record, so rank 0 does
            finish_record(spec, Outcome())
    except UsageError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except BaseException:
        # once stopped, a collective may fail first because a peer is gone: the launcher reports the stop
        if stops.asked is not None:
            lifetime.exit_now(128 + stops.asked)
        raise
    return 0


if __name__ == "__main__":
    code = main()
    if multiprocessing.parent_process() is None:
        lifetime.exit_now(code)
    elif code:  # forked by torchrun's agent (forking_torchrun), which learns a rank's end from how it returns
        sys.exit(code)
