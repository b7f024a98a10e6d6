"""Guided decoding on the transformers AR engine: a request's JSON schema as a token mask, with llguidance.

    grammars = Grammars(tokenizer, eos_ids, vocab)      # a text-writing stage (ARAdapter.text_tokenizer)
    seq.grammar = grammars.start(params)                 # None unless params["structured_outputs"]
    grammars.mask(logits, seqs)                          # before sampling: rows with a grammar keep only
                                                         # the tokens it allows next
    stopped = grammars.consume(seq, token)               # after: True once the grammar is complete

params["structured_outputs"] is what api/structured.py sends every guided stage: {"json": schema}
or {"json_object": True}. JSON is compact (no free whitespace), as on the vLLM stages: a weak model
could otherwise write blanks until max_tokens. A schema llguidance cannot compile is a ValueError
naming response_format (a 400). The mask is built on the host per step (llguidance's Rust matcher),
only for batches that hold a guided request; others keep the engine's fast path.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.workers.engines.hf_ar_adapter import ARSeq

JSON_OPTIONS = {"whitespace_flexible": False}


class Grammars:
    def __init__(self, tokenizer: Any, eos_ids: list[int], vocab: int) -> None:
        import llguidance.hf

        self.info = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos_ids))
        self.vocab = vocab

    def start(self, params: dict[str, Any]) -> Any:
        """The request's matcher (None without structured outputs); ValueError for a schema it cannot follow."""
        import llguidance

        wanted = params.get("structured_outputs")
        if not wanted:
            return None
        schema = wanted.get("json") if isinstance(wanted.get("json"), dict) else {"type": "object"}
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as err:
            raise ValueError(f"response_format: the decoder cannot follow this JSON schema: {err}") from None
        matcher = llguidance.LLMatcher(self.info, grammar)
        if matcher.is_error():
            raise ValueError(f"response_format: the decoder cannot follow this JSON schema: {matcher.get_error()}")
        return matcher

    def mask(self, logits: torch.Tensor, seqs: list[ARSeq]) -> None:
        """Disallow, in place, each guided row's tokens its grammar does not take next ([batch, vocab'])."""
        from llguidance.torch import (
            allocate_token_bitmask,
            apply_token_bitmask_inplace,
            fill_next_token_bitmask,
        )

        bitmask = allocate_token_bitmask(len(seqs), self.vocab)  # all allowed until filled
        for i, seq in enumerate(seqs):
            if seq.grammar is not None:
                fill_next_token_bitmask(seq.grammar, bitmask, i)
        width = min(self.vocab, logits.shape[1])
        apply_token_bitmask_inplace(logits[:, :width], bitmask.to(logits.device, non_blocking=True))
        if logits.shape[1] > width:  # ids past the tokenizer's (padding rows of the head): never in a grammar
            guided = [i for i, s in enumerate(seqs) if s.grammar is not None]
            logits[guided, width:] = float("-inf")

    @staticmethod
    def consume(seq: ARSeq, token: int) -> bool:
        """Advance the request's grammar by its sampled token; True once the grammar has ended."""
        seq.grammar.consume_token(token)
        return bool(seq.grammar.is_stopped())
