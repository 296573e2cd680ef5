"""transformers' GPT-2 with a forward made for training: token ids in, final hidden states out.

transformers' own forward builds its attention mask on every call and, to detect packed sequences, reads
a comparison of the position ids back to the host (masking_utils.find_packed_sequence_indices): on a GPU
that is a stall in every micro-step. Training here never packs or pads sequences, so the blocks run with
no mask and SDPA attends causally. The modules and their parameter names are transformers' own."""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel


class GPT2(GPT2LMHeadModel):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states after ln_f, through the tied head (model.DeferredHead, which leaves the product
        with the embedding to the loss)."""
        body = self.transformer
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = body.drop(body.wte(input_ids) + body.wpe(positions))
        for block in body.h:
            hidden = block(hidden)
        return self.lm_head(body.ln_f(hidden))
