"""Higgs-Audio-V2's step sampler (sampler.py): the delay pattern's forced codes, greedy rows, the
filtered distribution, and draws that depend on the row alone (not its batch, not the ranked width,
not whether a CUDA graph replays them)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from omni_actors.models.higgs_audio_v2.sampler import FrameSampler

N, VOCAB = 4, 1026
BOS, EOS = VOCAB - 2, VOCAB - 1


def _sampler(device: str = "cpu", graphs: bool = False, rows: int = 8, ras=None) -> FrameSampler:
    return FrameSampler(
        groups=N, vocab=VOCAB, bos=BOS, eos=EOS, ras=ras, embed=lambda codes: codes.float().sum(-1, keepdim=True),
        device=torch.device(device), graphs=graphs, max_rows=rows,
    )  # fmt: skip


def _draw(sampler: FrameSampler, logits: torch.Tensor, rows: list[tuple]) -> np.ndarray:
    """rows: (step, first eos, top_k, key, temperature, top_p) each."""
    ints = np.array([r[:4] for r in rows], dtype=np.int64)
    floats = np.array([r[4:] for r in rows], dtype=np.float32)
    with torch.inference_mode():
        codes, frames, _ = sampler.draw(logits.to(sampler.device), ints, floats, None)
    assert torch.equal(frames[:, 0].cpu(), codes.float().sum(-1).cpu())  # the frame embeds the drawn codes
    return codes.cpu().numpy()


def test_a_rows_draw_is_the_same_alone_batched_and_at_any_ranked_width() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, N * VOCAB, generator=gen) * 3
    a = (20, -1, 50, 7, 0.8, 0.9)
    alone = _draw(_sampler(), logits[:1], [a])
    assert _sampler().width([(0.8, 50, 0.9)]) == 64
    batched = _draw(_sampler(), logits, [a, (30, -1, 0, 8, 1.0, 1.0), (9, -1, 50, 9, 0.0, 1.0)])  # width: all
    assert np.array_equal(alone[0], batched[0])
    others = {tuple(_draw(_sampler(), logits[:1], [(20, -1, 50, key, 0.8, 0.9)])[0]) for key in range(20)}
    steps = {tuple(_draw(_sampler(), logits[:1], [(step, -1, 50, 7, 0.8, 0.9)])[0]) for step in range(20, 40)}
    assert len(others) > 1 and len(steps) > 1  # other keys, later steps: other draws


def test_the_delay_pattern_forces_bos_ramp_and_eos_end_and_greedy_rows_take_the_masked_argmax() -> None:
    logits = torch.randn(3, N * VOCAB, generator=torch.Generator().manual_seed(1))
    logits.view(3, N, VOCAB)[:, :, BOS] = 100.0  # bos is the best code everywhere: free codebooks must skip it
    rows = [(0, -1, 50, 1, 0.7, 1.0), (2, -1, 0, 2, 0.0, 1.0), (12, 10, 50, 3, 0.7, 0.95)]
    codes = _draw(_sampler(), logits, rows)
    assert list(codes[0]) == [BOS] * N  # step 0: all bos
    assert list(codes[1, 2:]) == [BOS] * (N - 2) and BOS not in codes[1, :2]
    free = logits.view(3, N, VOCAB)[1, :2, :BOS]
    assert list(codes[1, :2]) == free.argmax(-1).tolist()  # greedy: the argmax of what the mask left
    # eos first drawn at step 10: at step 12 codebooks 0 and 1 (12 - 10 > k) are forced to eos
    assert list(codes[2, :2]) == [EOS, EOS] and EOS not in codes[2, 2:] and BOS not in codes[2, 2:]


def test_draws_follow_the_filtered_softmax() -> None:
    grid = torch.full((1, N, VOCAB), -30.0)
    grid[0, :, 3], grid[0, :, 4], grid[0, :, 5] = math.log(0.6), math.log(0.3), math.log(0.1)
    logits = grid.view(1, -1).expand(400, -1).contiguous()
    sampler = _sampler(rows=512)
    plain = _draw(sampler, logits, [(N + 5, -1, 0, key, 1.0, 1.0) for key in range(400)])
    share = (plain == 3).mean(), (plain == 4).mean(), (plain == 5).mean()
    assert abs(share[0] - 0.6) < 0.05 and abs(share[1] - 0.3) < 0.05 and abs(share[2] - 0.1) < 0.04
    top2 = _draw(sampler, logits, [(N + 5, -1, 2, key, 1.0, 1.0) for key in range(400)])
    assert set(np.unique(top2)) == {3, 4}
    nucleus = _draw(sampler, logits, [(N + 5, -1, 0, key, 1.0, 0.5) for key in range(400)])
    assert set(np.unique(nucleus)) == {3}  # the first code's 0.6 already covers top_p 0.5


def test_a_draw_from_the_state_advanced_on_the_device_equals_one_from_the_hosts() -> None:
    """A step queued ahead draws from state `advance` moved on the device: the step count, the first
    eos (a row that just drew one), and the RAS window; the codes are the host-state draw's."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, N * VOCAB, generator=gen)
    logits.view(2, N, VOCAB)[1, 0, EOS] = 100.0  # row 1 draws eos in codebook 0 now
    sampler = _sampler(ras=(3, 2))
    ints = np.array([[6, -1, 50, 1], [7, -1, 0, 2]])
    floats = np.array([[0.9, 0.95], [0.0, 1.0]], dtype=np.float32)
    window = np.full((2, 3, N), -1)
    window[:, -1] = 5
    with torch.inference_mode():
        codes, _, width = sampler.draw(logits, ints, floats, window)
        assert codes[1, 0] == EOS
        sampler.advance(codes)
        following = torch.randn(2, N * VOCAB, generator=gen)
        ahead, _, _ = sampler.draw(following, None, None, None, width)
        moved = np.concatenate([window[:, 1:], codes.numpy()[:, None]], axis=1)
        host_ints = ints + np.array([[1, 0, 0, 0], [1, 8, 0, 0]])  # row 1: first eos at step 7
        again, _, _ = _sampler(ras=(3, 2)).draw(following, host_ints, floats, moved)
    assert torch.equal(ahead, again)
    assert ahead[1, 0] == EOS  # step 8, eos first at 7: codebook 0 forced to eos


def test_more_rows_than_the_sampler_was_sized_for_is_an_error() -> None:
    with pytest.raises(ValueError, match="sized for 2"):
        _draw(_sampler(rows=2), torch.zeros(3, N * VOCAB), [(5, -1, 0, 1, 1.0, 1.0)] * 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graph_replays_draw_what_eager_steps_draw() -> None:
    gen = torch.Generator().manual_seed(2)
    graphed, eager = _sampler("cuda", graphs=True, rows=16), _sampler("cuda", graphs=False, rows=16)
    for n in (1, 3, 16, 5, 3):
        logits = torch.randn(n, N * VOCAB, generator=gen) * 2
        rows = [(9 + i, -1, 50 if i % 2 else 0, 100 + i, 0.7 if i % 3 else 0.0, 0.95) for i in range(n)]
        ours = _draw(graphed, logits, rows)
        assert np.array_equal(ours, _draw(eager, logits, rows))
        assert np.array_equal(ours, _draw(_sampler(rows=16), logits, rows))  # the CPU's draws too
    assert graphed.graphs.enabled and len(graphed.graphs.graphs) >= 3
