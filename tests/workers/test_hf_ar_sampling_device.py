"""HfAREngine's batched sampling (`pick`) on each device: greedy rows take the argmax, sampled
rows stay inside their top-k after the repetition penalty, and a seeded row repeats its draw.
On CUDA the step's small host lists reach the device from pinned memory without a stream
sync; the results must not depend on that."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_actors.workers.engines.hf_ar_sampling import pick  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
        ],
    ),
]
PARAMS = [
    {"temperature": 0.0},
    {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05},
    {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05},
    {"temperature": 1.3, "top_k": 5},
]


def _draw(logits: torch.Tensor, seen: list, seed: int) -> list[int]:
    dev = logits.device
    generators = [
        None,
        torch.Generator(device=dev).manual_seed(seed),
        None,
        torch.Generator(device=dev).manual_seed(seed + 1),
    ]
    return pick(logits, PARAMS, generators, seen).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_pick_on_each_device(device):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 1000, generator=gen) * 3).to(device)
    seen_rows = torch.zeros(1000, dtype=torch.bool)
    seen_rows[:50] = True
    seen = [None, seen_rows.to(device), seen_rows.to(device), None]
    first = _draw(logits, seen, seed=7)
    again = _draw(logits, seen, seed=7)
    assert first[0] == int(logits[0].argmax())
    assert first[1] == again[1] and first[3] == again[3]  # seeded rows repeat
    penalized = torch.where(logits > 0, logits / 1.05, logits * 1.05)
    for row, k in ((1, 40), (2, 40), (3, 5)):
        scores = penalized[row] if row in (1, 2) else logits[row]
        if row in (1, 2):
            scores = torch.where(seen_rows.to(device), scores, logits[row])
        allowed = set(torch.topk(scores, k).indices.tolist())
        for ids in (first, again):
            assert ids[row] in allowed, (row, ids[row])
    many = {tuple(_draw(logits, seen, seed=s)) for s in range(12)}
    assert len({ids[3] for ids in many}) > 1  # the seed matters: draws are not stuck


@pytest.mark.parametrize("device", DEVICES)
def test_rows_sharing_a_generator_draw_together_reproducibly(device):
    """One request's codebooks (rows sharing its generator): one noise draw for all of them,
    each row inside its own top-k, the same ids for the same seed, other ids for another."""
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(0)).to(device)
    params = [{"temperature": 1.0, "top_k": 3}] * 6

    def draw(seed: int) -> torch.Tensor:
        g = torch.Generator(device=device).manual_seed(seed)
        return pick(logits, params, [g] * 6).cpu()

    first = draw(5)
    top3 = torch.topk(logits.cpu(), 3, dim=-1).indices
    assert all(int(first[i]) in top3[i].tolist() for i in range(6))
    assert torch.equal(first, draw(5))
    assert any(not torch.equal(first, draw(s)) for s in (6, 7, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_a_seeded_rows_draw_does_not_depend_on_its_batch_mates_top_k(device):
    """Rows that all have a top-k rank only that many ids (topk, not a whole sort); a batch with a
    row that has none ranks everything. A seeded row draws the same id either way, and leaves its
    generator where it would have (codebook rows sharing one generator, and a lone seeded row)."""
    logits = (torch.randn(9, 1026, generator=torch.Generator().manual_seed(1)) * 3).to(device)
    ranked = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}
    params = [ranked] * 8 + [{"temperature": 0.8, "top_p": 0.9}]

    def draw(rows: int) -> tuple[list[int], float, float]:
        shared = torch.Generator(device=device).manual_seed(3)
        lone = torch.Generator(device=device).manual_seed(4)
        gens = [shared] * 7 + [lone, None]
        ids = pick(logits[:rows], params[:rows], gens[:rows]).tolist()
        after = [float(torch.rand(1, generator=g, device=device)) for g in (shared, lone)]
        return ids, *after

    top_k_only, with_a_whole_sort = draw(8), draw(9)  # 8 rows: topk; 9: the last row has no top-k
    assert top_k_only[0] == with_a_whole_sort[0][:8]
    assert top_k_only[1:] == with_a_whole_sort[1:]
