"""Mimi (transformers' `MimiModel`) encoding and decoding one 80 ms frame at a time, for a batch of slots.

Causal convolutions keep their left context in a per-slot padding cache
(transformers' streaming encoder path, `MimiConv1dPaddingCache`); the
transformers inside Mimi run with a `RingKV`. transformers has no streaming
decoder, so both SEANet stacks are walked layer by layer here, the decoder's
transposed convolutions overlap-adding their tails (`TransposedTail`). Streamed output equals Mimi's
non-streaming `encode`/`decode` of the whole signal (tests/models/test_moshi.py).
"""

from __future__ import annotations

import torch
from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

from omni_actors.models.moshi.streaming import RingKV, SlotPaddingCache, TransposedTail


def _transformer_step(tr, ring: RingKV, h: torch.Tensor) -> torch.Tensor:
    """Run a MimiTransformerModel on `h` [S, T, D], new tokens of every slot."""
    positions, mask = ring.begin(h.shape[1])
    emb = tr.rotary_emb(h, positions)
    for layer in tr.layers:
        h = layer(h, attention_mask=mask, past_key_values=ring, position_embeddings=emb)[0]
    ring.finish(h.shape[1])
    return h


def _conv(layer: MimiConv1d, x: torch.Tensor, cache: SlotPaddingCache) -> torch.Tensor:
    """A causal MimiConv1d on one frame: what its padding-cache forward does, without its per-call
    length arithmetic (frames are whole multiples of every stride)."""
    return layer.conv(cache.pad(x, layer.layer_idx))


def _walk(layers, x: torch.Tensor, cache: SlotPaddingCache, tails: dict[int, TransposedTail]) -> torch.Tensor:
    """A SEANet encoder's or decoder's layers, streaming."""
    for i, layer in enumerate(layers):
        if i in tails:
            x = tails[i](x)
        elif isinstance(layer, MimiConv1d):
            x = _conv(layer, x, cache)
        elif isinstance(layer, MimiResnetBlock):
            residual = x
            for sub in layer.block:
                x = _conv(sub, x, cache) if isinstance(sub, MimiConv1d) else sub(x)
            short = layer.shortcut
            x = x + (_conv(short, residual, cache) if isinstance(short, MimiConv1d) else short(residual))
        else:
            x = layer(x)
    return x


def _ring(mimi, slots: int, tokens: int, dtype: torch.dtype, device) -> RingKV:
    cfg = mimi.config
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    return RingKV(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, head_dim, cfg.sliding_window, tokens,
                  dtype, device)


class StreamingMimi:
    """Per-slot streaming state of one MimiModel; `encode`/`decode` step every slot by one frame."""

    def __init__(self, mimi, slots: int, num_codebooks: int) -> None:
        cfg = mimi.config
        if not cfg.use_causal_conv:
            raise ValueError("streaming Mimi needs causal convolutions (use_causal_conv)")
        p = next(mimi.parameters())
        dtype, device = p.dtype, p.device
        self.mimi = mimi
        self.num_codebooks = num_codebooks
        hop = 1
        for r in cfg.upsampling_ratios:
            hop *= r
        ratio = int(cfg.encodec_frame_rate / cfg.frame_rate)
        self.tokens = ratio  # encoder/decoder transformer tokens per frame
        self.frame_samples = hop * ratio
        enc_convs = [mimi.encoder.get_submodule(n) for n in mimi.encoder._mimiconv1d_layer_names]
        enc_convs.append(mimi.downsample)
        self.enc_pad = SlotPaddingCache(enc_convs, slots, dtype, device)
        self.enc_ring = _ring(mimi, slots, ratio, dtype, device)
        dec_convs: list[MimiConv1d] = []
        self.tails: dict[int, TransposedTail] = {}
        for i, layer in enumerate(mimi.decoder.layers):
            if isinstance(layer, MimiConv1d):
                dec_convs.append(layer)
            elif isinstance(layer, MimiResnetBlock):
                dec_convs.extend(m for m in (*layer.block, layer.shortcut) if isinstance(m, MimiConv1d))
            elif isinstance(layer, MimiConvTranspose1d):
                self.tails[i] = TransposedTail(layer, slots, dtype, device)
        for idx, conv in enumerate(dec_convs):
            conv.layer_idx = idx  # the decoder's convs have none; only the streaming path reads it
        self.dec_pad = SlotPaddingCache(dec_convs, slots, dtype, device)
        self.dec_ring = _ring(mimi, slots, ratio, dtype, device)
        self.up_tail = TransposedTail(mimi.upsample, slots, dtype, device)

    def reset(self, slot: int) -> None:
        self.reset_encoder(slot)
        self.reset_decoder(slot)

    def reset_encoder(self, slot: int) -> None:
        self.enc_pad.reset(slot)
        self.enc_ring.reset(slot)

    def reset_decoder(self, slot: int) -> None:
        self.dec_pad.reset(slot)
        self.dec_ring.reset(slot)
        self.up_tail.reset(slot)
        for tail in self.tails.values():
            tail.reset(slot)

    @torch.no_grad()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """[S, frame_samples] float audio -> [S, num_codebooks] codes of that frame."""
        m = self.mimi
        x = _walk(m.encoder.layers, audio[:, None, :].to(self.enc_ring.dtype), self.enc_pad, {})
        h = _transformer_step(m.encoder_transformer, self.enc_ring, x.transpose(1, 2))
        x = _conv(m.downsample, h.transpose(1, 2), self.enc_pad)
        self.enc_pad.finish()
        codes = m.quantizer.encode(x, self.num_codebooks)  # [K, S, 1]
        return codes[:, :, 0].transpose(0, 1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[S, num_codebooks] codes -> [S, frame_samples] float audio."""
        m = self.mimi
        x = m.quantizer.decode(codes[:, :, None])
        x = self.up_tail(x)
        h = _transformer_step(m.decoder_transformer, self.dec_ring, x.transpose(1, 2))
        x = _walk(m.decoder.layers, h.transpose(1, 2), self.dec_pad, self.tails)
        self.dec_pad.finish()
        return x[:, 0, :]
