"""GPU throughput and model FLOPs utilisation: GPT-2 small (paper preset), context 1024,
bf16 by default, torch.compile on, one GPU, through the real Trainer.

    python bench/mfu.py [--rounds 6] [--steps 5] [--warmup 10] [--precision P] [--peak-tflops T] [--set key=value ...]
                        [--beside key=value ...] [--profile-steps N]

MFU = tokens/s x (6N + 12*L*H*Q*T) / peak, where the peak is that of the arithmetic --precision
runs (fp32: non-tensor-core FP32; tf32: TF32 tensor cores; bf16/fp16/apex: 16-bit tensor cores),
from gpt2dist.system.hardware's table for known GPUs or --peak-tflops for others.
Target: >= 50% on H100/H200 for bf16. The MFU comes with a 95% interval over the measured steps
(log scale) and a verdict on the target, and the GPU's SM clock and slowdown reasons during them
(NVML), so a throttled GPU is named rather than averaged in.

Beside it, in the same run and on the same model, batch and optimizer, a bare training loop
(bench/common.py: forward, the full logits' cross-entropy, backward, clip, step), interleaved with the
engine round by round: engine/bare with its 95% interval (target >= 0.97) says what the engine's own
work costs, apart from what the GPU can do at all.

--beside key=value adds an engine built with that setting on top of the first's (an engine switch such as
train.compile_whole_model=true or train.head_loss_chunk_tokens=8192), interleaved in the same rounds: its MFU
and its ratio to today's engine, so one GPU run measures a change before and after, side by side. Repeated,
each --beside is an engine of its own, every switch measured against the same rounds of today's. One --beside
may set several keys, space-separated: --beside "train.compile_whole_model=true train.cuda_graphs=true".

--profile-steps N then profiles N more engine steps (torch.profiler): the time ledger's split of their
wall time (compute, communication, data, idle: the GPU waiting on the host, syncs and launch gaps) and
the operators that take the GPU's time, so a change to the engine starts from what the profile shows.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from common import (
    against_target,
    bare_loop,
    engine,
    median,
    single_trainer,
    verdict_line,
)

from gpt2dist.config.schema import PRECISIONS
from gpt2dist.config.sizes import flops_per_token
from gpt2dist.errors import OneLineArgumentParser
from gpt2dist.results.statistics import log_interval
from gpt2dist.system.gpu_telemetry import DISTURBING_REASONS
from gpt2dist.system.hardware import COMPUTE_DTYPE, mfu, peak_flops
from gpt2dist.training.ledger import PARTS, profile_ledger


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of engine and bare loop")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per round and contender")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--precision", default="bf16", choices=PRECISIONS)
    parser.add_argument("--peak-tflops", type=float, default=None, help="override for GPUs not in the table")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="preset override key=value")
    parser.add_argument("--beside", action="append", default=[], help="another engine with these overrides added "
                        "(key=value, several space-separated; repeatable, an engine each), measured in the same "
                        "rounds")
    parser.add_argument("--profile-steps", type=int, default=0, help="then profile this many engine steps (the "
                        "last --beside engine's, where there is one)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/mfu.py needs a CUDA GPU")
    name = torch.cuda.get_device_name(0)
    peak = peak_flops(name, args.precision, args.peak_tflops)
    if peak is None:
        sys.exit(f"no peak FLOP/s known for '{name}'; pass --peak-tflops")
    trainer = single_trainer("paper", args.precision, ["train.compile=true", *args.overrides])
    changed = {switch: single_trainer("paper", args.precision,
                                      ["train.compile=true", *args.overrides, *switch.split()])
               for switch in args.beside}
    for contender in (trainer, *changed.values()):
        engine(contender, 0, args.warmup)  # compile, allocator, clocks
    bare_loop(trainer, 2)
    lines, ours, theirs = [], [], []
    beside: dict[str, list[float]] = {switch: [] for switch in changed}
    for r in range(args.rounds):  # interleaved so drift and clocks hit all alike
        first = args.warmup + r * args.steps
        ours.append(engine(trainer, first, args.steps, lines))
        theirs.append(bare_loop(trainer, args.steps))
        for switch, contender in changed.items():
            beside[switch].append(engine(contender, first, args.steps))
    per_token = flops_per_token(trainer.spec.model)
    print(f"{name}: GPT-2 small, context {trainer.spec.model.n_positions}, {args.precision}, compile on, "
          f"micro-batch {trainer.spec.train.micro_batch_size}, accumulation {trainer.strategy.degrees.grad_accum_steps}; "
          f"{args.rounds} rounds x {args.steps} steps each; {per_token / 1e6:.0f} MFLOP/token, "
          f"{COMPUTE_DTYPE[args.precision]} peak {peak / 1e12:.1f} TFLOP/s")
    contenders = [("engine   ", ours), ("bare loop", theirs)] + [(f"engine with {switch}", rates)
                                                                 for switch, rates in beside.items()]
    for label, rates in contenders:
        rate, low, high = log_interval(rates)
        utilisation = [mfu(x, per_token, 1, peak) for x in (rate, low, high)]
        print(f"{label} tokens/s {rate:,.0f} ({low:,.0f} to {high:,.0f}); MFU {utilisation[0]:.1%} "
              f"({utilisation[1]:.1%} to {utilisation[2]:.1%}): {against_target(utilisation[1], utilisation[2], 0.5)}")
    print(verdict_line("engine/bare loop", ours, theirs, 0.97))
    for switch, rates in beside.items():  # above 1: the switch makes the engine faster
        print(verdict_line(f"engine with {switch}/engine", rates, ours, 1.0))
    clocks = [line["sm_clock_mhz"] for line in lines if "sm_clock_mhz" in line]
    slowed = sum(bool(line.get("clock_event_reasons", 0) & DISTURBING_REASONS) for line in lines)
    if clocks:
        print(f"SM clock median {median(clocks):,.0f} MHz (min {min(clocks):,}); steps with a thermal, power-brake "
              f"or hardware slowdown: {slowed}")
    else:
        print(f"GPU telemetry: {trainer.telemetry.unavailable}")
    if args.profile_steps:
        profile([trainer, *changed.values()][-1], args.warmup + args.rounds * args.steps, args.profile_steps)


def profile(trainer, first_step: int, steps: int) -> None:
    """Where the steps' time goes (the time ledger's parts: a GPU idle between kernels shows as idle) and the
    operators that take the GPU's time, from torch.profiler."""
    cuda = trainer.place.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        engine(trainer, first_step, steps)
    ledger = profile_ledger(prof, cuda)
    step_s = sum(ledger[part] for part in PARTS)
    print(f"profile of {ledger['traced_steps']} steps, {step_s * 1e3:,.1f} ms each: " + ", ".join(
        f"{part.removesuffix('_s')} {ledger[part] / step_s:.1%}" for part in PARTS))
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
