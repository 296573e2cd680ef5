"""Tokenization throughput, MB of text per second: gpt2dist's GPT-2 encoder (the one
`prepare` uses: tiktoken's BPE in one process per core) against tiktoken's own batch
encoding (threads) with the same GPT-2 files, on 1 core and on all cores, over the same
text in one run. Also prints `tokenizers`' batched encode, the engine gpt2dist used first.

    python bench/tokenize_throughput.py [--mb 20] [--repeats 3]

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

BATCH = 1024  # documents per call, as prepare's default data.batch_documents


def corpus(megabytes: float) -> list[str]:
    from gpt2dist.data.corpus import stdlib_docstrings

    docs = list(stdlib_docstrings(200))
    size = sum(len(d.encode()) for d in docs)
    return docs * max(1, round(megabytes * 1e6 / size))


def measure(engine: str, cores: str, megabytes: float, repeats: int) -> dict:
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
    best = float("inf")
    for _ in range(repeats):  # the process pool starts inside run(): its start-up is measured, as in prepare
        started = time.perf_counter()
        tokens = run()
        best = min(best, time.perf_counter() - started)
    return {"mb_per_s": size / 1e6 / best, "tokens": tokens, "mb": size / 1e6}


def child(engine: str, cores: str, args) -> dict:
    env = dict(os.environ)
    if engine == "tokenizers" and cores == "1":
        env["TOKENIZERS_PARALLELISM"] = "false"  # the Rust pool then runs on the calling thread only
    out = subprocess.run([sys.executable, __file__, "--child", engine, cores, "--mb", str(args.mb),
                          "--repeats", str(args.repeats)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "CORES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.mb, args.repeats)))
        return
    from gpt2dist.data.tokenizer import GPT2_FILES, default_gpt2_dir

    if not all((default_gpt2_dir() / f).is_file() for f in GPT2_FILES):
        sys.exit(f"GPT-2 files missing in {default_gpt2_dir()}; run containers/fetch_gpt2_tokenizer.sh")
    results = {(e, c): child(e, c, args) for c in ("1", "all") for e in ("gpt2dist", "tiktoken", "tokenizers")}
    first = results[("gpt2dist", "1")]
    assert all(r["tokens"] == first["tokens"] for r in results.values()), "engines disagree on the token count"
    print(f"{first['mb']:.1f} MB of stdlib docstrings, {first['tokens']:,} GPT-2 tokens, best of {args.repeats}, "
          f"{os.cpu_count()} cores")
    for cores in ("1", "all"):
        ours, theirs = results[("gpt2dist", cores)]["mb_per_s"], results[("tiktoken", cores)]["mb_per_s"]
        hf = results[("tokenizers", cores)]["mb_per_s"]
        print(f"{cores:>3} core(s): gpt2dist {ours:6.2f} MB/s   tiktoken {theirs:6.2f} MB/s   ratio {ours / theirs:.2f}x"
              f"   (tokenizers {hf:5.2f} MB/s)")
    print("target: ratio >= 1.0x with all cores")


if __name__ == "__main__":
    main()
