"""Moshi's text stream: each frame's token sent as the text it adds, multi-byte characters whole, nothing twice.

Real tokenizers: the tiny checkpoints' byte-level BPE, and a sentencepiece-style one (`▁` for spaces, byte
fallback for characters outside its vocabulary, as Moshi's) built here with `tokenizers`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from omni_actors.models.moshi.detokenize import MAX_PENDING, SlotText
from omni_actors.models.tiny.llama import _build_tokenizer

TEXT = "the café 日本 😀 is in the end of the long sentence"
"""Two-, three- and four-byte characters, each split over byte tokens, and many tokens after them."""


def sentencepiece_style() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{i:02X}>": 3 + i for i in range(256)}
    for piece in ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the"]:
        vocab[piece] = len(vocab)
    bpe = models.BPE(vocab=vocab, merges=[("▁", "t"), ("h", "e"), ("▁t", "he")], unk_token="<unk>",
                     byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module", params=["byte_bpe", "sentencepiece"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "byte_bpe":
        return _build_tokenizer(Path(tmp_path_factory.mktemp("tok")))
    return sentencepiece_style()


def test_pieces_join_up_to_the_text_with_every_character_whole_and_nothing_twice(tokenizer) -> None:
    ids = ids_of(tokenizer, TEXT)
    assert len(ids) > 16  # (past the 8 tokens of context the pieces were decoded with)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # (characters really are split over tokens)
    stream = SlotText(tokenizer)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == TEXT  # was "the caf\ufffdthe café \ufffd\ufffdcafé 日afé ..." (a piece per token)
    assert not any("\ufffd" in p for p in pieces)
    stream.reset()  # a new session on the slot starts from nothing
    assert "".join(stream.push(i) for i in ids_of(tokenizer, "the end")) == "the end"


def test_bytes_that_never_make_a_character_are_sent_not_held_and_a_slot_holds_few_ids(tokenizer) -> None:
    lead = ids_of(tokenizer, "日")[0]  # the first byte of a three-byte character
    stream = SlotText(tokenizer)
    pieces = [stream.push(lead) for _ in range(3 * MAX_PENDING)]
    assert sum(1 for p in pieces if p) >= 2  # (sent every MAX_PENDING tokens, not held for good)
    for _ in range(1000):
        stream.push(ids_of(tokenizer, "a")[0])
    assert len(stream.ids) <= 2 * MAX_PENDING  # what one slot holds stays bounded, however long it talks
