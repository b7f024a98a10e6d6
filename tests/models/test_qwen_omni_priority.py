"""First audio under load on the tiny Qwen3-Omni pipeline: step counts, not timing.

The three stage engines are driven in rounds (each stage with work steps once a
round; every output is handed downstream at once, as async chunk does). With
first-chunk priority a request's first audio takes as many rounds under load as
alone: ten requests started together all have their first audio in the round a
lone request has it, and a request that arrives while nine others stream has its
first audio as many rounds after its arrival as it would alone. Talker prompts
that start together run as one prefill forward. Codes are the same as alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402

PARAMS = {
    "max_tokens": 8, "ignore_eos": True, "talker_max_tokens": 16, "talker_temperature": 0.0,
    "talker_repetition_penalty": 1.0, "talker_ignore_eos": True,
}  # fmt: skip


@pytest.fixture(scope="module")
def q3_dir(tiny_model) -> Path:
    return tiny_model("qwen3_omni_moe")


def _ctx(spec, path: Path, extras: dict) -> EngineContext:
    return EngineContext(
        stage_id=spec.stage_id, replica=0, model_stage=spec.model_stage, model_path=path,
        device="cpu", max_num_seqs=10, dtype="float32", gpu_memory_utilization=0.5,
        tensor_parallel_size=1, engine_extras={**spec.engine_defaults, **extras},
    )  # fmt: skip


class Rounds:
    """The pipeline's three engines stepped in rounds; requests arrive at given rounds."""

    def __init__(self, path: Path, vocoder: dict | None = None, **extras) -> None:
        """`extras` go to every stage, `vocoder` to code2wav's (its chunk policy) as well."""
        pipe = get_pipeline("qwen3_omni_moe")
        self.engines = [
            resolve(s.engine)(_ctx(s, path, {**extras, **((vocoder or {}) if s.stage_id == 2 else {})}))
            for s in pipe.stages
        ]
        self.chunk = [
            resolve(s.chunk_processor) if s.chunk_processor else None for s in pipe.stages
        ]
        self.prefills: list[int] = []
        self.vocoder_steps: list[list[str]] = []
        """Request ids of each code2wav step's outputs."""
        """Batch size of each talker prefill forward."""
        talker = self.engines[1].adapter.model.model
        talker.register_forward_pre_hook(self._note, with_kwargs=True)

    def _note(self, module, args, kwargs) -> None:
        embeds = kwargs["inputs_embeds"]
        if embeds.shape[1] > 1:
            self.prefills.append(embeds.shape[0])

    def run(
        self, arrivals: dict[str, tuple[int, str]]
    ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """arrivals: request id -> (round, prompt). Returns each request's first-audio round
        (counted from its arrival) and its talker codes."""
        reqs = {
            rid: {"messages": [{"role": "user", "content": p}]} for rid, (_, p) in arrivals.items()
        }
        states: dict[str, list[dict]] = {rid: [{}, {}, {}] for rid in reqs}
        first: dict[str, int] = {}
        codes: dict[str, list] = {rid: [] for rid in reqs}
        rnd = 0
        while rnd <= max(r for r, _ in arrivals.values()) or any(
            e.has_work() for e in self.engines
        ):
            for rid, (at, _) in arrivals.items():
                if at == rnd:
                    for stage, eng in enumerate(self.engines):
                        eng.add(rid, reqs[rid], PARAMS, streaming=stage > 0)
            for stage, eng in enumerate(self.engines):
                if not eng.has_work():
                    continue
                outs = eng.step()
                if stage == 2:
                    self.vocoder_steps.append([o.request_id for o in outs])
                for out in outs:
                    rid = out.request_id
                    assert out.error is None, out.error
                    if stage == 1 and "codes" in out.payload:
                        codes[rid].append(np.asarray(out.payload["codes"]))
                    if stage == 2 and len(out.payload["audio"]) and rid not in first:
                        first[rid] = rnd - arrivals[rid][0]
                    if stage < 2:
                        nxt = self.chunk[stage + 1](
                            stage, out.payload, out.finished, reqs[rid], states[rid][stage + 1]
                        )
                        if nxt is not None or out.finished:
                            self.engines[stage + 1].feed(rid, nxt or {}, out.finished)
            rnd += 1
        return first, {rid: np.concatenate(c) for rid, c in codes.items()}


PROMPTS = [f"Request {i}: tell me about the number {i}." for i in range(10)]


def test_ten_requests_at_once_have_first_audio_in_the_round_one_alone_has(q3_dir):
    alone_first, alone_codes = Rounds(q3_dir).run({"alone": (0, PROMPTS[9])})
    rounds = Rounds(q3_dir)
    first, codes = rounds.run({f"r{i}": (0, p) for i, p in enumerate(PROMPTS)})
    assert set(first.values()) == {alone_first["alone"]}  # the 10th waits no longer than the 1st
    assert rounds.prefills == [10]  # ten talker prompts, one forward
    assert np.array_equal(codes["r9"], alone_codes["alone"])
    one_by_one = Rounds(q3_dir, batch_prefill=False)  # the baseline: a forward per prompt
    first_1, codes_1 = one_by_one.run({f"r{i}": (0, p) for i, p in enumerate(PROMPTS)})
    assert one_by_one.prefills == [1] * 10 and first_1 == first
    for rid, c in codes.items():
        assert np.array_equal(c, codes_1[rid])


FIXED_WINDOWS = {"first_chunk_size": 5, "chunk_size": 25, "max_chunk_size": 100}
"""A code2wav policy whose windows are few and far apart (the eager default: this CPU's)."""
DOUBLING_WINDOWS = {"first_chunk_size": 1, "chunk_size": 2}
"""The graphed default (CUDA): one code first, then windows doubling."""


@pytest.mark.parametrize("vocoder", [FIXED_WINDOWS, DOUBLING_WINDOWS])
def test_a_request_arriving_while_nine_stream_has_first_audio_as_fast_as_alone(q3_dir, vocoder):
    alone_first, alone_codes = Rounds(q3_dir, vocoder).run({"late": (0, PROMPTS[9])})
    arrivals = {f"r{i}": (0, PROMPTS[i]) for i in range(9)}
    arrivals["late"] = (alone_first["late"] + 6, PROMPTS[9])  # the nine are past their first audio
    rounds = Rounds(q3_dir, vocoder)
    first, codes = rounds.run(arrivals)
    assert first["late"] == alone_first["late"]
    assert np.array_equal(codes["late"], alone_codes["late"])
    assert rounds.prefills == [9, 1]


def test_a_first_window_due_with_the_others_bulk_goes_alone_and_first(q3_dir):
    alone_first, alone_codes = Rounds(q3_dir, FIXED_WINDOWS).run({"late": (0, PROMPTS[9])})
    arrivals = {f"r{i}": (0, PROMPTS[i]) for i in range(9)}
    # The late one's first window is ready in the round the nine's last windows are (the fixed
    # policy's windows are far apart, so the rounds are known): it goes first, in a step of its own.
    arrivals["late"] = (alone_first["late"] + 6, PROMPTS[9])
    rounds = Rounds(q3_dir, FIXED_WINDOWS)
    first, codes = rounds.run(arrivals)
    assert first["late"] == alone_first["late"]
    steps = rounds.vocoder_steps
    at = next(i for i, ids in enumerate(steps) if "late" in ids)
    assert steps[at] == ["late"] and len(steps[at + 1]) == 9  # the nine's bulk, next step
    assert np.array_equal(codes["late"], alone_codes["late"])
    assert rounds.prefills == [9, 1]
