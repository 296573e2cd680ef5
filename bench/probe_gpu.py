"""Where a training step's GPU time goes, and what a bare loop reaches, on one GPU (GPT-2 small, context 1024).

    python bench/probe_gpu.py [--budget-s 420] [--out DIR]

Profiles the engine (the real Trainer, `single`) for two steps with torch.profiler and sorts its
kernel time into GEMM, attention, cross-entropy, optimizer, fused elementwise and copies, the rest
of the wall time being the GPU idle; then times bare loops that differ in one choice each (eager or
compiled LM head + loss, padded vocabulary, micro-batch, whole-model compile). Variants run one after
the other until the budget is spent; each prints tokens/s and MFU as soon as it has them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import single_trainer

from gpt2dist.config.presets import load_params
from gpt2dist.config.sizes import flops_per_token
from gpt2dist.errors import OneLineArgumentParser
from gpt2dist.system.hardware import mfu, peak_flops
from gpt2dist.training.model import build_model, transformer_blocks

REPO = Path(__file__).resolve().parents[1]
CATEGORIES = [  # first match wins; names as cuBLAS, cuDNN, FlashAttention, Inductor and ATen print them
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("cross-entropy", ("log_softmax", "nll_loss", "cross_entropy", "softmax")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "sm80", "matmul", "ampere", "hopper")),
    ("copy/memset", ("memcpy", "memset", "copy")),
    ("fused (triton)", ("triton",)),
    ("other", ("",)),
]


def categorise(name: str) -> str:
    low = name.lower()
    return next(label for label, keys in CATEGORIES if any(k in low for k in keys))


def profile(step_fn, steps: int, label: str, out: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step_fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels: dict[str, float] = {}
    by_category: dict[str, float] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) or 0
        if device_us <= 0 or event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kernels[event.key] = kernels.get(event.key, 0.0) + device_us / 1e6
        by_category[categorise(event.key)] = by_category.get(categorise(event.key), 0.0) + device_us / 1e6
    busy = sum(by_category.values())
    print(f"\n== profile {label}: {steps} steps, wall {wall:.3f} s, kernels {busy:.3f} s, idle {wall - busy:.3f} s "
          f"({(wall - busy) / wall:.1%})")
    for category, seconds in sorted(by_category.items(), key=lambda kv: -kv[1]):
        print(f"   {category:16s} {seconds / steps * 1e3:9.1f} ms/step  {seconds / wall:6.1%} of wall")
    print("   top kernels:")
    for name, seconds in sorted(kernels.items(), key=lambda kv: -kv[1])[:18]:
        print(f"   {seconds / steps * 1e3:8.2f} ms/step  [{categorise(name)}] {name[:110]}")
    prof.export_chrome_trace(str(out / f"trace-{label}.json"))
    return {"wall_s": wall, "steps": steps, "categories": by_category, "top": sorted(kernels.items(), key=lambda kv: -kv[1])[:40]}


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int) -> torch.Tensor:
    """Mean cross-entropy of the tied head; columns past `vocab` (padding) are never predicted."""
    logits = F.linear(hidden, weight)[..., :vocab]
    return F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))


class Bare:
    """The textbook loop on one GPU: bf16 autocast, fused AdamW, clip 1.0; one choice varied at a time."""

    def __init__(self, model_cfg, *, micro: int, accum: int, pad_to: int, head: str, whole: bool):
        vocab = model_cfg.vocab_size
        model = build_model(model_cfg, seed=1337)
        if pad_to > 1 and vocab % pad_to:
            padded = (vocab + pad_to - 1) // pad_to * pad_to
            weight = torch.zeros(padded, model_cfg.n_embd)
            weight[:vocab] = model.transformer.wte.weight.data
            model.resize_token_embeddings(padded)
            model.transformer.wte.weight.data.copy_(weight)
        self.model = model.cuda()
        self.vocab, self.micro, self.accum, self.T = vocab, micro, accum, model_cfg.n_positions
        loss_fn = head_loss
        if whole:
            def forward(x, y):
                hidden = self.model.transformer(input_ids=x, use_cache=False, return_dict=False)[0]
                return loss_fn(hidden, self.model.lm_head.weight, y, self.vocab)
            self.forward = torch.compile(forward)
        else:
            for block in transformer_blocks(self.model):
                block.compile()
            compiled_head = torch.compile(loss_fn) if head == "compiled" else loss_fn

            def forward(x, y):
                hidden = self.model.transformer(input_ids=x, use_cache=False, return_dict=False)[0]
                return compiled_head(hidden, self.model.lm_head.weight, y, self.vocab)
            self.forward = forward
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                     lr=6e-4, betas=(0.9, 0.95), fused=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        self.data = torch.randint(0, vocab, (accum, micro, self.T + 1), device="cuda", generator=g)

    def step(self) -> torch.Tensor:
        total = torch.zeros((), device="cuda")
        for m in range(self.accum):
            x, y = self.data[m, :, :-1], self.data[m, :, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.forward(x, y) / self.accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total


def rate(step_fn, tokens_per_step: int, warmup: int, steps: int) -> tuple[float, float]:
    started = time.perf_counter()
    for _ in range(warmup):
        step_fn()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - started
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step_fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return tokens_per_step / times[len(times) // 2], compile_s


def main() -> None:
    parser = OneLineArgumentParser(__doc__)
    parser.add_argument("--budget-s", type=float, default=420)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--only", default="", help="comma-separated variant names to run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(0)
    peak = peak_flops(name, "bf16")
    _, preset = load_params(REPO / "params.yaml").preset("paper")
    per_token = flops_per_token(preset.model)
    global_batch, T = preset.train.global_batch_size, preset.model.n_positions
    tokens = global_batch * T
    print(f"{name}, torch {torch.__version__} (CUDA {torch.version.cuda}), peak bf16 {peak / 1e12:.0f} TFLOP/s, "
          f"{per_token / 1e6:.0f} MFLOP/token, global batch {global_batch} x {T}")
    results: dict = {"device": name, "torch": torch.__version__, "variants": {}}

    def report(label: str, tok_s: float, extra: str = "") -> None:
        results["variants"][label] = {"tokens_per_s": tok_s, "mfu": mfu(tok_s, per_token, 1, peak), "note": extra}
        print(f"-> {label:44s} {tok_s:10,.0f} tokens/s  MFU {mfu(tok_s, per_token, 1, peak):6.1%}  {extra}", flush=True)
        (args.out / "probe.json").write_text(json.dumps(results, indent=1))

    wanted = set(filter(None, args.only.split(",")))
    if not wanted or "engine" in wanted:
        trainer = single_trainer("paper", "bf16", ["train.compile=true"])
        counter = iter(range(10_000))
        engine_rate, compile_s = rate(lambda: trainer.train_step(next(counter)), tokens, 3, 8)
        report("engine (blocks compiled, mb16, eager head)", engine_rate, f"warm-up {compile_s:.0f} s")
        results["profile_engine"] = profile(lambda: trainer.train_step(next(counter)), 2, "engine", args.out)
        del trainer
        torch.cuda.empty_cache()

    variants = [  # label, micro, pad_to, head, whole
        ("bare-eager-head-mb16", 16, 1, "eager", False),
        ("bare-compiled-head-mb16", 16, 1, "compiled", False),
        ("bare-compiled-head-pad64-mb16", 16, 64, "compiled", False),
        ("bare-compiled-head-pad64-mb32", 32, 64, "compiled", False),
        ("bare-compiled-head-pad64-mb64", 64, 64, "compiled", False),
        ("bare-whole-pad64-mb32", 32, 64, "compiled", True),
    ]
    best = None
    for label, micro, pad_to, head, whole in variants:
        if wanted and label not in wanted:
            continue
        if time.perf_counter() - began > args.budget_s:
            print(f"(budget spent: skipped {label})")
            continue
        torch.cuda.reset_peak_memory_stats()
        bare = Bare(preset.model, micro=micro, accum=global_batch // micro, pad_to=pad_to, head=head, whole=whole)
        tok_s, compile_s = rate(bare.step, tokens, 2, 6)
        report(label, tok_s, f"warm-up {compile_s:.0f} s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        if best is None or tok_s > best[1]:
            best = (label, tok_s, bare)
        else:
            del bare
        torch.cuda.empty_cache()
    if best is not None and time.perf_counter() - began < args.budget_s + 60:
        results["profile_best"] = profile(best[2].step, 2, best[0], args.out)
    (args.out / "probe.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nprobe done in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
