"""Entry point of one training rank: `python -m gpt2dist.launch.worker SPEC_JSON`."""

from __future__ import annotations

import sys
from pathlib import Path

from gpt2dist.config import read_spec
from gpt2dist.errors import UsageError
from gpt2dist.logs import setup_logging
from gpt2dist.training import loop


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpt2dist.launch.worker SPEC_JSON", file=sys.stderr)
        return 2
    setup_logging()
    try:
        loop.run(read_spec(Path(args[0])))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
