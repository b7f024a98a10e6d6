"""A tiny random-weight LlamaForCausalLM checkpoint in real Hugging Face format, built offline.

The checkpoint is what vLLM and transformers load from a real model folder:
`config.json`, `model.safetensors`, `generation_config.json` and a fast
tokenizer (`tokenizer.json`, `tokenizer_config.json` with a chat template).
The tokenizer is a byte-level BPE trained in milliseconds on a few sentences,
so any text round-trips. Weights are drawn from a seeded generator: the same
seed writes the same bytes. head_dim is 32 because vLLM's CPU attention only
supports a fixed list of head sizes (32 and 64 are the small ones).

`reply=TEXT` writes a scripted checkpoint instead: TEXT is one added token and the
weights make greedy decoding answer any chat prompt with exactly TEXT, then the
end token (tests use it for an answer a random model never writes, e.g. a Hermes
tool call). Its layers add nothing to the residual stream, so each next token
depends on the last token only: after the generation prompt's closing newline
comes TEXT, after TEXT the end token. `reply=(PIECE, PIECE, ...)` chains several
added tokens the same way (distinct pieces, up to HIDDEN_SIZE - 1 of them), so the
answer streams in those pieces: prose, then a call's text bit by bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from omni_actors.models.tiny.common import byte_bpe, peak

CHAT_TEMPLATE = (
    # Tools as Hermes-style templates show them (a system turn listing the function schemas).
    "{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
    "</tools><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "Speech, text and images in; text, speech and images out.",
    "A pipeline is a small graph of stages that stream partial results.",
    "Once upon a time there was a tiny model that could only babble.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? : ; ' \" , .",
]

VOCAB_SIZE = 512
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2  # head_dim = 64 / 2 = 32
NUM_KV_HEADS = 1
INTERMEDIATE_SIZE = 128
MAX_POSITIONS = 1024


def _build_tokenizer(out_dir: Path):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = byte_bpe(_CORPUS, VOCAB_SIZE, SPECIAL_TOKENS)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_llama(out_dir: str | Path, seed: int = 0, reply: str | Sequence[str] | None = None) -> Path:
    """Write a tiny LlamaForCausalLM checkpoint into `out_dir` and return its path (`reply`: see above)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(out)
    pieces = [reply] if isinstance(reply, str) else list(reply or ())
    if pieces:
        if len(set(pieces)) != len(pieces) or len(pieces) >= HIDDEN_SIZE:
            raise ValueError(f"a scripted reply is 1 to {HIDDEN_SIZE - 1} distinct pieces")
        tokenizer.add_tokens(pieces)
        tokenizer.save_pretrained(out)
    vocab = len(tokenizer)
    # Round the embedding table up so every token id the tokenizer emits has a row.
    vocab_size = max(VOCAB_SIZE, (vocab + 63) // 64 * 64)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    bos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HIDDEN_SIZE // NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=bos_id,
        dtype="float32",
    )
    # A private RNG: the caller's global torch seed state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        peak(model, 0.2)
        if pieces:
            with torch.no_grad():
                _script(model, tokenizer, pieces, eos_id)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=bos_id).save_pretrained(
        out
    )
    return out


REPLY_LOGIT = 50.0
"""How far the scripted next token's logit stands above the random ones (about 0.2 * 8 each)."""


def _script(model, tokenizer, pieces: list[str], eos_id: int) -> None:
    """Weights for the reply: the prompt's last token ("\\n") leads to the first piece's token, each
    piece's to the next one's, the last one's to the end (transition i on hidden axis i)."""
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))
    (nl_id,) = newline  # (the byte-level BPE keeps a lone newline as one token)
    chain = [nl_id, *tokenizer.convert_tokens_to_ids(pieces), eos_id]
    for layer in model.model.layers:  # nothing written to the residual stream: it stays the embedding
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.model.norm.weight.fill_(1.0)
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    for axis, (token, nxt) in enumerate(pairwise(chain)):
        emb[token] = 0.0
        emb[token, axis] = 1.0  # after RMSNorm: sqrt(hidden) on `axis`, 0 elsewhere
        head[:, axis] = 0.0
        head[nxt, axis] = REPLY_LOGIT / HIDDEN_SIZE ** 0.5


if __name__ == "__main__":
    import sys

    print(make_tiny_llama(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
