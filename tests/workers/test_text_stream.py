"""TextStream on a SentencePiece-style tokenizer (Metaspace, byte fallback, the first space stripped
on decode), built offline: a window decoded without the token before it would lose word spaces."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from omni_actors.workers.engines.hf_ar_adapter import TextStream

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, naïve café", "streams of text"] * 50


@pytest.fixture(scope="module")
def sentencepiece_like() -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])  # fmt: skip
    specials = ["<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("seed", range(4))
def test_deltas_keep_word_spaces_and_join_to_the_decode(sentencepiece_like, seed) -> None:
    tok = sentencepiece_like
    rng = random.Random(seed)
    ids = tok("the quick brown fox, naïve café hello world").input_ids
    ids += [rng.randrange(len(tok)) for _ in range(60)]  # byte pieces, specials, words
    stream, out = TextStream(tok), ""
    for i, t in enumerate(ids):
        out += stream.push(t, final=i == len(ids) - 1)
        assert tok.decode(ids[: i + 1], skip_special_tokens=True).startswith(out)
    assert out == tok.decode(ids, skip_special_tokens=True)
    assert out.startswith("the quick brown fox, naïve café")
