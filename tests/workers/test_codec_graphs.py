"""Causal codec decoders under codec_graphs.CodecGraphs: padded, graphed decodes equal eager ones.

On the CPU: the property the padding rests on, for each decoder that uses it (Mimi for csm,
Qwen3-Omni's code2wav, Qwen3-TTS's codec): a window decoded with zero-code frames to its right
and rows below, cut to its own length, is the window decoded alone. Marked `gpu` (run with
`pytest -m gpu tests/workers/test_codec_graphs.py`): the adapters' graphed decodes, over batch
and length buckets, against their eager decodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.codec_graphs import LENGTHS, CodecGraphs  # noqa: E402
from omni_actors.workers.engines.generation import GenerationEngine  # noqa: E402

ADAPTERS = {
    "csm": ("omni_actors.models.csm.codec:MimiCodecAdapter", 64),
    "qwen3_omni_moe": (
        "omni_actors.models.qwen3_omni_moe.code2wav:Qwen3OmniMoeCode2WavAdapter",
        2048,
    ),
    "qwen3_tts": ("omni_actors.models.qwen3_tts.codec:Qwen3TTSCodecAdapter", 64),
}


def _adapter(family: str, tmp: Path, device: str, **extras):
    adapter, _ = ADAPTERS[family]
    ctx = EngineContext(
        stage_id=1, replica=0, model_stage="codec", model_path=make_tiny(family, tmp / family),
        device=device, max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5,
        tensor_parallel_size=1, engine_extras={"adapter": adapter, **extras},
    )  # fmt: skip
    return GenerationEngine(ctx).adapter


def _codes(family: str, groups: int, batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.as_tensor(
        np.random.default_rng(seed).integers(0, ADAPTERS[family][1], (batch, groups, length))
    )


@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_right_and_row_padding_leave_a_causal_decoders_samples_as_they_were(
    family, tmp_path
) -> None:
    adapter = _adapter(family, tmp_path, "cpu")
    assert not adapter.graphs.enabled  # graphs are for CUDA; on the CPU a decode runs as it is
    for batch, length in [(1, 1), (2, 3), (3, 7)]:
        codes = _codes(family, adapter.groups, batch, length, seed=length)
        bucket_b, bucket_n = adapter.graphs.bucket(batch, length)
        padded = torch.zeros(bucket_b, adapter.groups, bucket_n, dtype=torch.long)
        padded[:batch, :, :length] = codes
        with torch.inference_mode():
            alone = adapter.graphs.decode(codes)
            whole = adapter.graphs.decode(padded)
        cut = whole.shape[-1] - (bucket_n - length) * adapter.samples_per_code
        assert cut == alone.shape[-1]
        # (samples ~1-4: float32 sums over another batch shape round apart by ~1e-5 on some hosts)
        np.testing.assert_allclose(whole[:batch, :cut].numpy(), alone.numpy(), atol=5e-5)


def test_a_decode_past_the_largest_bucket_goes_to_replays_rows_at_a_time() -> None:
    graphs = CodecGraphs(lambda c: c, groups=4, samples_per_code=10, device="cpu", max_batch=16,
                         enabled=False, max_codes=1024)  # fmt: skip
    assert graphs.batches == [1, 2, 4, 8, 16]
    assert graphs.rows_per_replay(16, 75) == 8  # (16, 96) is 1,536 codes; (8, 96) fits
    assert graphs.rows_per_replay(16, 30) is None  # (16, 32) fits: one replay
    assert graphs.rows_per_replay(2, LENGTHS[-1] + 1) is None  # longer than every bucket: eager


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_graphed_decodes_equal_eager_ones_on_cuda(family, tmp_path, monkeypatch) -> None:
    # cuDNN picks a convolution algorithm per shape, and with TF32 (torch's default for
    # convolutions) a padded bucket's algorithm rounds differently from the unpadded shape's: Mimi's
    # random-weight convolutions took that to 2e-2 at batch 2 x 5 frames. In float32 proper,
    # padding and replay must not change a sample.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    graphed = _adapter(family, tmp_path / "g", "cuda")
    eager = _adapter(family, tmp_path / "e", "cuda", cuda_graphs=False)
    assert graphed.graphs.enabled and not eager.graphs.enabled
    g = graphed.graphs  # every bucket captured at load
    assert len(g.graphs.graphs) == sum(b * n <= g.max_codes for b in g.batches for n in LENGTHS)
    captured = len(g.graphs.graphs)
    shapes = [(1, 1), (3, 1), (2, 5), (8, 30), (1, LENGTHS[-1]), (1, LENGTHS[-1] + 1)]
    for i, (batch, length) in enumerate(shapes * 2):  # twice: captures, then replays
        codes = _codes(family, graphed.groups, batch, length, seed=i).cuda()
        with torch.inference_mode():  # as GenerationEngine decodes
            want = eager.graphs.run(codes).cpu().numpy()
            got = graphed.graphs.run(codes).cpu().numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"{family} batch {batch} length {length}")
    assert len(g.graphs.graphs) == captured  # nothing captured while serving
    small = CodecGraphs(g.decode, graphed.groups, graphed.samples_per_code, "cuda", 8, True, max_codes=256)
    small.warm(1)
    assert small.rows_per_replay(8, 40) == 4  # (8, 48) is past 256 codes: two replays of (4, 48)
    codes = _codes(family, graphed.groups, 8, 40, seed=99).cuda()
    with torch.inference_mode():
        want, got = eager.graphs.run(codes).cpu().numpy(), small.run(codes).cpu().numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"{family} split into replays")
