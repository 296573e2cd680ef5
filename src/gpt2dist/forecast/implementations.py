"""How each training program the GPU step model prices computes GPT-2's step (forecast.gpu_step.Implementation):
this engine's own, and those behind the published measurements (published_gpt2.csv's `implementation` column).

Every number is counted from the program's code at the version its measurement ran (the `read_from` of each), at the
precision it ran in, never fitted: a block's elementwise kernels and the bytes they move per token (in units of the
width), the bytes per element of materialised attention scores, the loss's bytes per token and vocabulary entry, how
the optimizer steps, which host syncs each step takes. Backward's counts follow autograd's formulas for the forward
operations read; they are estimates, and docs/planning.md says so."""

from __future__ import annotations

from dataclasses import replace

from gpt2dist.config.memory import Kept
from gpt2dist.config.schema import RunSpec
from gpt2dist.errors import UsageError
from gpt2dist.config.units import compute_bytes, FP32, HALF
from gpt2dist.forecast.gpu_step import Implementation

ENGINE_NAME = "gpt2dist"  # the table's name for this engine's own runs
# Dropout on a tensor: read and written, and a one-byte mask kept for backward, which reads both and writes one
DROPOUT_SITE = 3
# Megatron's CheckpointFunction (mpu/random.py) per block: forward saves the CPU, CUDA and model-parallel tracker's RNG
# states (3); backward detaches the input, sets the three states, recomputes (its kernels counted apart), sets them
# back (3) and calls autograd's backward on the outputs (1)
MEGATRON_CHECKPOINT_OPS = 11
MEGATRON_LM_2021 = Implementation(
    "megatron-lm-2021", "NVIDIA Megatron-LM 8aa4619 (fp16 model, FusedLayerNorm, fused bias-GELU and bias-dropout-"
    "add, fused causal softmax, FusedAdam, local DDP after backward)", attention="materialized", kernels=(9, 24),
    width_bytes=(12 * HALF + 2, 20 * HALF + 2), inner_bytes=(16 * HALF, 44 * HALF),
    score_bytes=(5 * HALF + 2, 8 * HALF + 1), head_bytes=(38, 12), head_kernels=(7, 3),
    accumulate_grads=True, master_copies=True, clip="multi-tensor", syncs_per_step=3, overlaps_backward=False,
    vocab_parallel=True, checkpoint_host_ops=MEGATRON_CHECKPOINT_OPS,
    kept=Kept(width=12, split=24, checkpointed=HALF, scores=5, head=10, vocab_split=True))
PUBLISHED = {implementation.name: implementation for implementation in (
    Implementation(
        "transformers-4.3", "transformers 4.3.0 models/gpt2/modeling_gpt2.py, trainer.py and optimization.py (AdamW); "
        "PyTorch 1.7-1.8", attention="materialized", kernels=(31, 37),
        # fp32: norms 6, dropouts 4, adds 6, the projections' bias copies 4 (addmm copies the bias, then re-reads
        # it); split: qkv and fc bias copies 14, q/k/v copies 6, heads merged 2, GELU's eight operations 72
        width_bytes=(20 * FP32, 32 * FP32), inner_bytes=(94 * FP32, 127 * FP32),
        # scaled, masked (torch.where), the all-ones attention mask added, softmax, dropout: 12 elements read and
        # written forward, 13 backward, with one-byte masks
        score_bytes=(12 * FP32 + 2, 13 * FP32 + 1), head_bytes=(4 * FP32, 7 * FP32), head_kernels=(3, 4),
        accumulate_grads=True, optimizer="loop", clip="per-tensor", syncs_per_step=1,
        # kept: GELU's intermediates on the 4x width, q/k/v, the softmax and dropout outputs with the mask; the fp32
        # logits, their shifted copy and log-softmax
        kept=Kept(width=22, split=128, checkpointed=FP32, scores=9, head=16, gradient_buckets=True)),
    Implementation(
        "transformers-4.12-amp", "transformers 4.12.0 GPT2Attention and Trainer with --fp16 (torch.amp, GradScaler), "
        "PyTorch 1.9-1.10", attention="materialized", kernels=(37, 43),
        # autocast runs the norms, the residual stream and GELU (pow is on its fp32 list) in fp32, the rest in fp16,
        # and casts between them
        width_bytes=(76, 78), inner_bytes=(380, 526),
        score_bytes=(36 + 2, 44 + 1), head_bytes=(18, 28), head_kernels=(4, 5),
        weight_casts=True, accumulate_grads=True, optimizer="loop", clip="per-tensor", syncs_per_step=5,
        kept=Kept(width=20, split=110, checkpointed=FP32, scores=9, head=12, gradient_buckets=True,
                  weight_copies=HALF)),
    Implementation(
        "transformers-4.12-deepspeed-0.5", "transformers 4.12.0 with DeepSpeed 0.5 (fp16 engine, ZeRO stage 1, "
        "transformers.AdamW over flat partitions, no clipping)", attention="materialized", kernels=(31, 37),
        width_bytes=(20 * HALF, 32 * HALF), inner_bytes=(94 * HALF, 127 * HALF),
        score_bytes=(12 * HALF + 2, 13 * HALF + 1), head_bytes=(4 * HALF, 7 * HALF), head_kernels=(3, 4),
        # two checks per gradient piece of the rank's partition: about 148 tensors over these runs' 16 ranks
        optimizer="loop", optimizer_tensors=2, master_copies=True, syncs_per_step=3, syncs_per_tensor=(0, 2 / 16),
        overlaps_backward=False, kept=Kept(width=11, split=64, checkpointed=HALF, scores=5, head=8)),
    MEGATRON_LM_2021,
    # the same model code as Megatron-LM's: its own kernels, and the gradients' all-reduce under backward
    replace(MEGATRON_LM_2021, name="megatron-deepspeed-2023", read_from=(
        "microsoft/Megatron-DeepSpeed's GPT as vTrain profiles it (VIA-Research/vTrain f8dda84 src/model/"
        "gpt_modeling.py, layers.py, fused_softmax.py, fused_bias_gelu.py, fused_adam.py: fp16, FusedScaleMaskSoftmax, "
        "attention dropout 0.1, jit-fused bias-dropout-add and bias-GELU, vocabulary-parallel head, FusedAdam over fp32 "
        "masters, gradients all-reduced after backward)"), kernels=(8, 17),
        # forward: two norms (read, write) and two bias-dropout-adds (x and the residual read, the sum and its mask
        # written) on the width; the heads merged by a copy and the fused bias-GELU on the split widths; backward:
        # each of those by autograd's formulas, the norms' weight gradients, the bias gradients' reductions and the
        # residual stream's two gradient sums
        width_bytes=(11 * HALF, 23 * HALF), inner_bytes=(10 * HALF, 21 * HALF),
        # the fused scale-mask-softmax read and written, dropout read and written with its one-byte mask; backward
        # dropout's (the mask read) and softmax's (its output and the gradient read, one written)
        score_bytes=(4 * HALF + 1, 5 * HALF + 1), overlaps_backward=True),
    Implementation(
        "deepspeed-megatron-0.3", "DeepSpeedExamples Megatron-LM a79272c with DeepSpeed 0.3.0 (fp16 model, apex "
        "FusedLayerNorm, scripted GELU, mask arithmetic on the scores, FusedAdam; a sync per gradient tensor to check "
        "overflow, another for its norm under ZeRO), PyTorch 1.6", attention="materialized", kernels=(22, 26),
        width_bytes=(18 * HALF + 2, 20 * HALF + 2), inner_bytes=(30 * HALF, 35 * HALF),
        score_bytes=(12 * HALF, 13 * HALF), head_bytes=(38, 14), head_kernels=(7, 3),
        optimizer_tensors=2, master_copies=True, clip="multi-tensor", syncs_per_step=3, syncs_per_tensor=(1, 2),
        overlaps_backward=False, kept=Kept(width=12, split=28, checkpointed=HALF, scores=5, head=14)),
    Implementation(
        "llm.c-2024-05", "karpathy/llm.c a0d5dbb and 42dff87 train_gpt2.cu (cuDNN attention, fused residual and layer "
        "norm, cuBLASLt bias epilogues, fused classifier, one AdamW kernel per packed tensor; ZeRO-1 reduce-scatter "
        "after backward)", attention="flash", kernels=(3, 11), width_bytes=(8 * HALF, 10 * HALF),
        inner_bytes=(12 * HALF, 29 * HALF), head_bytes=(HALF, 2 * HALF), head_kernels=(1, 0), optimizer_tensors=16,
        clip="multi-tensor", syncs_per_step=4, launch="native", overlaps_backward=False, wire_bytes=HALF,
        kept=Kept(width=8, split=24, checkpointed=HALF, head=HALF)),
    Implementation(
        "llm.c-2024-07", "karpathy/llm.c c6efd90 and 7ecd890 train_gpt2.cu (as llm.c-2024-05, the reduce-scatter per "
        "layer under backward)", attention="flash", kernels=(3, 11), width_bytes=(8 * HALF, 10 * HALF),
        inner_bytes=(12 * HALF, 29 * HALF), head_bytes=(HALF, 2 * HALF), head_kernels=(1, 0), optimizer_tensors=16,
        clip="multi-tensor", syncs_per_step=4, launch="native", wire_bytes=HALF,
        kept=Kept(width=8, split=24, checkpointed=HALF, head=HALF)),
    Implementation(
        "llm.c-pytorch-2024-04", "karpathy/llm.c f7fb3e6 train_gpt2.py (PyTorch 2.1, the whole model compiled, manual "
        "attention fused by Inductor, TF32, foreach Adam, no clipping, the same batch every step)",
        attention="materialized", kernels=(6, 10), width_bytes=(10 * FP32, 18 * FP32),
        inner_bytes=(15 * FP32, 27 * FP32), score_bytes=(2 * FP32, 4 * FP32), head_bytes=(2 * FP32, 3 * FP32),
        optimizer="foreach", syncs_per_step=1,
        kept=Kept(width=16, split=48, checkpointed=FP32, scores=FP32, head=2 * FP32)),
    Implementation(
        "composer-0.13", "mosaicml/examples 3bbda73 MosaicGPT on Composer 0.13.2 (FSDP FULL_SHARD in bf16 'PURE', "
        "Triton flash attention, bf16 layer norm, fused cross-entropy, DecoupledAdamW over the flat shards)",
        attention="flash", kernels=(5, 12), width_bytes=(10 * HALF, 20 * HALF), inner_bytes=(12 * HALF, 33 * HALF),
        head_bytes=(HALF, 2 * HALF), head_kernels=(1, 1), optimizer="loop", optimizer_tensors=14,
        clip="multi-tensor", syncs_per_step=5, wire_bytes=HALF,
        kept=Kept(width=8, split=24, checkpointed=HALF, head=HALF)),
    Implementation(
        "lightning-transformers-4.21-amp", "hpcaitech/ColossalAI-Pytorch-lightning benchmark/gpt: transformers 4.21 "
        "GPT2LMHeadModel under Lightning's precision 16 (autocast), DDP, Adam tensor by tensor, no clipping; two "
        "host syncs per block and forward", attention="materialized", kernels=(37, 43), width_bytes=(76, 78),
        inner_bytes=(380, 526), score_bytes=(36 + 2, 44 + 1), head_bytes=(18, 28), head_kernels=(4, 5),
        weight_casts=True, optimizer="loop", syncs_per_step=2, syncs_per_layer=2,
        kept=Kept(width=20, split=110, checkpointed=FP32, scores=9, head=12, gradient_buckets=True,
                  weight_copies=HALF)),
    Implementation(
        "torch-compile-2", "nanoGPT-style PyTorch 2 training (the whole model compiled, SDPA flash attention, bf16 "
        "autocast, fused or foreach AdamW, clipping): gollem, llm.c's train_gpt2.py of June 2024, nanoGPT of 2023",
        attention="flash", kernels=(6, 12), width_bytes=(20, 40), inner_bytes=(20, 40),
        head_bytes=(HALF, 2 * HALF), head_kernels=(2, 2), weight_casts=True, clip="multi-tensor", syncs_per_step=1,
        # kept: the fp32 residual stream twice, q/k/v, the attention output, the MLP's input to GELU and its output
        # in bf16; the bf16 logits, and their gradient in backward
        kept=Kept(width=2 * FP32, split=12 * HALF, checkpointed=FP32, head=2 * HALF, weight_copies=HALF)),
)}


def engine_implementation(spec: RunSpec) -> Implementation:
    """This engine as it runs `spec` on a GPU (training/gpt2.py, model.py, loop.py): SDPA's fused attention, each
    block compiled (its norms, residual adds and GELU fused), the head's loss compiled, fused AdamW, torch.amp's
    autocast in 16 bits, clipping; dropout, where the model has it, on the embeddings and both residual branches."""
    element = compute_bytes(spec.precision)
    dropout = DROPOUT_SITE * element * bool(spec.model.dropout)
    return Implementation(
        ENGINE_NAME, "gpt2dist's training/gpt2.py, model.py and loop.py", attention="flash", kernels=(10, 30),
        width_bytes=(10 * FP32 + 2 * dropout, 20 * FP32 + 2 * dropout),
        inner_bytes=(6 * element, 10 * element), head_bytes=(element, 2 * element), head_kernels=(2, 2),
        weight_casts=True, accumulate_grads=spec.train.global_batch_size > spec.train.micro_batch_size,
        clip="multi-tensor" if spec.train.grad_clip else "none", syncs_per_step=2)


def implementation_named(name: str) -> Implementation:
    """A published source's implementation by name, refused in one line where unknown."""
    if name not in PUBLISHED:
        raise UsageError(f"implementation {name!r} is not one the step model knows (known: {', '.join(PUBLISHED)}); "
                         "name one of them in the table's implementation column")
    return PUBLISHED[name]
