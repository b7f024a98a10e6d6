"""Counter-based noise: a row's uniforms are a function of (key, counter, index, salt) alone, and look uniform."""

from __future__ import annotations

import pytest
import torch

from omni_actors.workers.engines.counter_noise import counter_uniform, mix32, noise_key


def test_a_rows_values_do_not_depend_on_its_batch_or_on_the_part_asked_for() -> None:
    keys, counters = torch.tensor([7, 123456789, 7]), torch.tensor([0, 5, 1])
    index = torch.arange(4096)
    batch = counter_uniform(keys, counters, index)
    alone = counter_uniform(keys[1:2], counters[1:2], index)
    assert torch.equal(batch[1:2], alone)
    part = counter_uniform(keys, counters, index.view(4, 1024)[:, :50])  # a codebook's first 50 ranks
    assert torch.equal(part, batch.view(3, 4, 1024)[:, :, :50])
    assert not torch.equal(batch[0], batch[2])  # the next step draws anew
    assert not torch.equal(counter_uniform(keys, counters, index, salt=1), batch)  # a second draw of the step


def test_values_are_strictly_inside_zero_and_one_and_spread_evenly() -> None:
    u = counter_uniform(torch.arange(64), torch.arange(64) * 3, torch.arange(8192)).flatten()
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)
    expected = u.numel() / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 60.0, chi2  # 15 degrees of freedom: ~37 at p = 0.001
    assert abs(float(u.mean()) - 0.5) < 0.005
    # neighbouring elements and neighbouring keys are not correlated
    a = counter_uniform(torch.tensor([1, 2]), torch.tensor([0, 0]), torch.arange(100_000))
    assert abs(float(torch.corrcoef(torch.stack([a[0, :-1], a[0, 1:]]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(a)[0, 1])) < 0.02


def test_mix32_stays_in_32_bits_and_keys_come_from_every_bit_of_a_seed() -> None:
    x = torch.tensor([0, 1, 0xFFFFFFFF, 0x80000000])
    y = mix32(x)
    assert int(y.min()) >= 0 and int(y.max()) <= 0xFFFFFFFF and len(set(y.tolist())) == 4
    assert noise_key(3) == noise_key(3) != noise_key(4)
    assert noise_key(1 << 40) != noise_key(0)  # the high half counts too
    assert 0 <= noise_key(-1) <= 0xFFFFFFFF and 0 <= noise_key(None) <= 0xFFFFFFFF


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_gpu_draws_the_cpus_values() -> None:
    keys, counters, index = torch.tensor([9, 10]), torch.tensor([3, 4]), torch.arange(2048)
    cpu = counter_uniform(keys, counters, index)
    gpu = counter_uniform(keys.cuda(), counters.cuda(), index.cuda())
    assert torch.equal(cpu, gpu.cpu())
