"""The moshi family's streaming parts equal transformers' whole-sequence forward passes (tiny checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

from omni_actors.models.moshi.lm import DuplexLM
from omni_actors.models.moshi.mimi_stream import StreamingMimi
from omni_actors.models.moshi.streaming import RingKV
from omni_actors.models.tiny import make_tiny

SLOTS = 3
FRAMES = 8
FRAME = 1920


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import MoshiForConditionalGeneration

    folder = make_tiny("moshi", tmp_path_factory.mktemp("moshi"))
    return MoshiForConditionalGeneration.from_pretrained(folder).eval()


def test_checkpoint_is_the_real_format(model, tmp_path: Path) -> None:
    cfg = model.config
    assert cfg.model_type == "moshi" and cfg.audio_encoder_config.model_type == "mimi"
    assert cfg.audio_encoder_config.frame_size == FRAME and cfg.audio_encoder_config.sampling_rate == 24_000


def test_streamed_mimi_equals_whole_signal_encode_and_decode(model) -> None:
    mimi = model.audio_encoder
    mimi.config.sliding_window = 5  # < tokens streamed: the ring wraps (the mask is read from the config)
    try:
        stream = StreamingMimi(mimi, SLOTS, model.config.num_codebooks)
        assert stream.frame_samples == FRAME
        audio = torch.randn(SLOTS, FRAMES * FRAME, generator=torch.Generator().manual_seed(0)) * 0.2
        with torch.no_grad():
            whole = mimi.encode(audio[:, None], num_quantizers=model.config.num_codebooks).audio_codes
            streamed = torch.stack([stream.encode(audio[:, i * FRAME:(i + 1) * FRAME]) for i in range(FRAMES)], -1)
            assert torch.equal(whole, streamed)
            assert len(torch.unique(whole)) > 1, "codes should vary with the input"
            ref = mimi.decode(whole).audio_values[:, 0]
            got = torch.cat([stream.decode(whole[:, :, i]) for i in range(FRAMES)], -1)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    finally:
        mimi.config.sliding_window = 250


def test_ring_cache_step_equals_the_temporal_transformer_on_the_whole_sequence(model) -> None:
    cfg = model.config
    dec = model.decoder.model
    embeds = torch.randn(1, FRAMES, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    ring = RingKV(cfg.num_hidden_layers, 2, cfg.num_key_value_heads, cfg.head_dim, 64, 1, torch.float32, "cpu")
    ring.length[1] = 5  # the other row is elsewhere in its own stream
    steps = []
    with torch.no_grad():
        whole = dec(inputs_embeds=embeds).last_hidden_state[0]
        for t in range(FRAMES):
            h = embeds[:, t:t + 1].expand(2, -1, -1).contiguous()
            positions, mask = ring.begin(1)
            for layer in dec.layers:
                h = layer(h, attention_mask=mask, position_ids=positions, past_key_values=ring)[0]
            ring.finish(1)
            steps.append(dec.norm(h)[0, 0])
    torch.testing.assert_close(torch.stack(steps), whole, rtol=1e-4, atol=1e-4)


def test_a_slot_depends_on_its_own_seed_and_input_only(model) -> None:
    lm = DuplexLM(model, SLOTS)
    codes = torch.randint(0, model.config.audio_vocab_size, (FRAMES, SLOTS, model.config.num_codebooks),
                          generator=torch.Generator().manual_seed(2))

    def run(slot: int, others: bool) -> list[np.ndarray]:
        for s in range(SLOTS):
            lm.stop(s)
        lm.start(slot, seed=5)
        if others:
            for s in range(SLOTS):
                if s != slot:
                    lm.start(s, seed=100 + s)
        out = []
        for t in range(FRAMES):
            text, frame, _ready = lm.step(codes[t] if others else codes[t, [0] * SLOTS])
            out.append(np.concatenate([text[slot:slot + 1].numpy(), frame[slot].numpy()]))
        return out

    alone, crowded = run(0, others=False), run(2, others=True)
    assert not all(np.array_equal(a, c) for a, c in zip(alone, crowded, strict=True))  # inputs differ
    # the same slot input, the same seed, different slot and neighbours: the same tokens
    codes[:, 2] = codes[:, 0]
    assert all(np.array_equal(a, c) for a, c in zip(alone, run(2, others=True), strict=True))
