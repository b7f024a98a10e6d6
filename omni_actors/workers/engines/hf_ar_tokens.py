"""HfAREngine's tokens of a step: each row's token picked, and its request ended on a stop, max_tokens or a full cache.

A mixin of HfAREngine (hf_ar.py), which holds the state these methods use (adapter, grammars,
max_len, _raw_logits) and the method they call (_drop: hf_ar.py). A token is the step's own
argmax where every row is greedy over raw logits, else picked over the adapter's processed
logits (hf_ar_sampling.py), masked by the request's grammar when guided (hf_ar_grammar.py),
or drawn by the adapter itself.
"""

from __future__ import annotations

from typing import Any

from omni_actors.workers.engine import EngineOutput
from omni_actors.workers.engines.hf_ar_adapter import ARSeq, ForwardOut
from omni_actors.workers.engines.hf_ar_grammar import Grammars
from omni_actors.workers.engines.hf_ar_sampling import all_greedy, pick_rows

DEFAULT_MAX_TOKENS = 4096
"""Tokens a request may generate when its params name no max_tokens."""


class TokenSteps:
    """HfAREngine's sampling of a step's rows and the outputs it returns for them."""

    def _guided(self, seqs: list[ARSeq]) -> bool:
        return self.grammars is not None and any(s.grammar is not None for s in seqs)

    def _grammars(self) -> Grammars:
        """The stage's grammar compiler (made on the first guided request)."""
        if self.grammars is None:
            text = self.adapter.text_tokenizer()
            if text is None:
                raise ValueError("response_format: this stage does not guide its decoding; ask for plain text")
            self.grammars = Grammars(*text)
        return self.grammars

    def _sample(self, seqs: list[ARSeq], out: ForwardOut, prefill: bool, drawn: Any = None) -> list[EngineOutput]:
        guided = self._guided(seqs)
        if drawn is not None:  # the adapter's draw, queued with the step
            took = self.adapter.take_draw(seqs, drawn)
        else:
            took = None if guided else self.adapter.draw(seqs, out, prefill)
        tokens, results = took if took is not None else self._pick(seqs, out, prefill, guided)
        ended = [guided and s.grammar is not None and Grammars.consume(s, t) for s, t in zip(seqs, tokens, strict=True)]
        outputs = []
        for seq, tok, done, (payload, finished) in zip(seqs, tokens, ended, results, strict=True):
            seq.tokens.append(tok)
            reason = "stop" if finished or done or tok in self.adapter.stop_ids(seq) else None
            if reason is None and (self._full(seq) or len(seq.tokens) >= int(
                seq.params.get("max_tokens") or DEFAULT_MAX_TOKENS
            )):
                reason = "length"
            if len(seq.tokens) == 1 and "text" in payload:  # (a route that cuts the text at `stop` ends the
                payload = {**payload, "prompt_tokens": seq.prompt_len}  # request before its last payload)
            if reason is not None:
                finished = True
                seq.finished = True
                self._drop(seq)
                payload = {**payload, "finish_reason": payload.get("finish_reason", reason),
                           "prompt_tokens": seq.prompt_len, "completion_tokens": len(seq.tokens)}
            outputs.append(EngineOutput(seq.request_id, payload, finished))
        return outputs

    def _full(self, seq: ARSeq) -> bool:
        """The request's KV holds max_len positions: no next step can take its last token, so that
        token ends it ("length", as vLLM ends a request at max_model_len), whatever max_tokens says."""
        return self.max_len is not None and seq.cached >= self.max_len

    def _pick(
        self, seqs: list[ARSeq], out: ForwardOut, prefill: bool, guided: bool
    ) -> tuple[list[int], list[tuple[dict[str, Any], bool]]]:
        """The engine's sampling of a step: a token per row, and the adapter's (payload, finished) per seq."""
        if out.tokens is not None and self._raw_logits and not guided and all_greedy(seqs):
            ids = out.tokens  # the argmax the step took: B ids, no vocab pass
        else:
            logits = self.adapter.process_logits(seqs, out.logits.float())
            if guided:
                self.grammars.mask(logits, seqs)
            ids = pick_rows(logits, seqs)
        on_device = None if guided else self.adapter.on_device_tokens(seqs, ids, out, prefill)
        if on_device is None:
            tokens = ids.tolist()
            results = self.adapter.on_tokens(seqs, tokens, out, prefill)
        else:
            tokens, results = on_device
        return tokens, results
