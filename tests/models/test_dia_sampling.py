"""Dia's batched sampling rules (models/dia/sampling.py): a batch of mixed settings draws what each request draws alone."""

from __future__ import annotations

import torch

from omni_actors.models.dia.sampling import draw

CHANNELS, VOCAB, EOS = 9, 1028, 1024
PARAMS = [
    {"temperature": 0.0, "guidance_scale": 3.0, "top_k": 45},  # greedy on the guided top-k
    {"temperature": 1.8, "guidance_scale": 3.0, "top_k": 45, "top_p": 0.9},  # Dia's defaults
    {"temperature": 0.7, "guidance_scale": 1.0, "top_p": 0.5},  # no guidance, cool, nucleus
    {"temperature": 3.0, "guidance_scale": 2.0, "top_k": 0},  # guided logits themselves
    {"temperature": 1.0, "top_k": 5000},  # top_k past the vocabulary: all
]


def _logits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cond = torch.randn(len(PARAMS), CHANNELS, VOCAB, generator=g) * 4
    uncond = torch.randn(len(PARAMS), CHANNELS, VOCAB, generator=g) * 4
    cond[1, 0, EOS] = 50.0  # channel 0 of request 1 says end
    return cond, uncond


def test_a_batch_of_mixed_settings_draws_what_each_request_draws_alone() -> None:
    for seed in range(5):
        cond, uncond = _logits(seed)
        gens = [torch.Generator().manual_seed(100 + i) for i in range(len(PARAMS))]
        together = draw(cond, uncond, PARAMS, gens, EOS)
        for i, p in enumerate(PARAMS):
            alone = draw(
                cond[i : i + 1],
                uncond[i : i + 1],
                [p],
                [torch.Generator().manual_seed(100 + i)],
                EOS,
            )
            assert torch.equal(together[i], alone[0]), (seed, i)
        assert together.shape == (len(PARAMS), CHANNELS)
        assert (together[:, 1:] < EOS).all(), (
            "only channel 0 may say end; no channel says pad or bos"
        )
        assert (together[:, 0] <= EOS).all() and together[1, 0] == EOS
        guided = cond[0] + (cond[0] - uncond[0]) * 3.0
        top = guided.topk(45, dim=-1).indices
        kept = cond[0].masked_fill(
            ~torch.zeros_like(guided, dtype=torch.bool).scatter(-1, top, True), -1e9
        )
        assert kept[0, : EOS + 1].argmax() != EOS  # so channel 0 does not end either
        assert torch.equal(together[0], kept[:, :EOS].argmax(-1)), (
            "greedy: the conditioned best of the guided top-k"
        )
    other = draw(cond, uncond, PARAMS, [torch.Generator().manual_seed(7)] * len(PARAMS), EOS)
    assert not torch.equal(other[1:], together[1:]), "the draws should follow the generators"
