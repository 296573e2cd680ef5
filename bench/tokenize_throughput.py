"""Tokenization throughput, MB of text per second: gpt2dist's GPT-2 encoder (the one
`prepare` uses: tiktoken's BPE in one process per core) against tiktoken's own batch
encoding (threads) with the same GPT-2 files, on 1 core and on all cores, over the same
text in one run. Also prints `tokenizers`' batched encode, the engine gpt2dist used first.

    python bench/tokenize_throughput.py [--mb 20] [--rounds 5]

Each round runs every engine once, in turn, so drift hits all of them alike; the ratio is
paired by round and printed with its 95% interval and a verdict on the target.
Needs GPT-2's encoder.json and vocab.bpe (containers/fetch_gpt2_tokenizer.sh).
Target: gpt2dist >= 1.0x tiktoken with all cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from gpt2dist.errors import OneLineArgumentParser

BATCH = 1024  # documents per call, as prepare's default data.batch_documents


def corpus(megabytes: float) -> list[str]:
    from gpt2dist.data.corpus import stdlib_docstrings

    docs = list(stdlib_docstrings(200))
    size = sum(len(d.encode()) for d in docs)
    return docs * max(1, round(megabytes * 1e6 / size))


def measure(engine: str, cores: str, megabytes: float) -> dict:
    from gpt2dist.data.encoding import GPT2Encoder, gpt2_tiktoken
    from gpt2dist.data.tokenizer import default_gpt2_dir, gpt2_from_files

    texts = corpus(megabytes)
    size = sum(len(t.encode()) for t in texts)
    threads = 1 if cores == "1" else os.cpu_count()
    files = (default_gpt2_dir() / "encoder.json", default_gpt2_dir() / "vocab.bpe")
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    if engine == "gpt2dist":
        encoder = GPT2Encoder(*files, workers=threads)

        def run() -> int:
            return sum(len(ids) for batch in encoder.encode(iter(batches)) for ids in batch)
    elif engine == "tokenizers":
        tokenizer = gpt2_from_files(default_gpt2_dir()).tokenizer

        def run() -> int:
            return sum(len(e.ids) for batch in batches for e in tokenizer.encode_batch_fast(batch, add_special_tokens=False))
    else:
        enc = gpt2_tiktoken(*files)

        def run() -> int:
            return sum(len(ids) for batch in batches for ids in enc.encode_ordinary_batch(batch, num_threads=threads))
    run()  # warm-up
    started = time.perf_counter()  # the process pool starts inside run(): its start-up is measured, as in prepare
    tokens = run()
    return {"mb_per_s": size / 1e6 / (time.perf_counter() - started), "tokens": tokens, "mb": size / 1e6}


def child(engine: str, cores: str, args) -> dict:
    env = dict(os.environ)
    if engine == "tokenizers" and cores == "1":
        env["TOKENIZERS_PARALLELISM"] = "false"  # the Rust pool then runs on the calling thread only
    out = subprocess.run([sys.executable, __file__, "--child", engine, cores, "--mb", str(args.mb)],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "CORES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.mb)))
        return
    from common import LoadMonitor, machine_line, median, verdict_line

    from gpt2dist.data.tokenizer import GPT2_FILES, default_gpt2_dir

    if not all((default_gpt2_dir() / f).is_file() for f in GPT2_FILES):
        sys.exit(f"GPT-2 files missing in {default_gpt2_dir()}; run containers/fetch_gpt2_tokenizer.sh")
    engines = ("gpt2dist", "tiktoken", "tokenizers")
    results = {(e, c): [] for c in ("1", "all") for e in engines}
    with LoadMonitor() as monitor:
        for _ in range(args.rounds):
            for key in results:
                results[key].append(child(*key, args))
    first = results[("gpt2dist", "1")][0]
    assert all(r["tokens"] == first["tokens"] for rs in results.values() for r in rs), "engines disagree on the tokens"
    print(f"{first['mb']:.1f} MB of stdlib docstrings, {first['tokens']:,} GPT-2 tokens, {args.rounds} rounds, "
          f"{os.cpu_count()} cores")
    rates = {key: [r["mb_per_s"] for r in rs] for key, rs in results.items()}
    for cores in ("1", "all"):
        ours, theirs, hf = (rates[(e, cores)] for e in engines)
        print(f"{cores:>3} core(s): gpt2dist {median(ours):6.2f} MB/s   tiktoken {median(theirs):6.2f} MB/s   "
              f"(tokenizers {median(hf):5.2f} MB/s), medians of rounds")
        print("    " + verdict_line(f"gpt2dist/tiktoken, {cores} core(s)", ours, theirs, 1.0))
    print(machine_line(monitor))


if __name__ == "__main__":
    main()
