"""MoshiFrame, the graph-ready frame step: sync-free, in-place state, equal to transformers' forward (tiny checkpoint).

On CPU the frame runs eagerly; what a CUDA graph needs of it is checked here: no
host syncs inside the device half of a step, every state buffer keeps its memory
from step to step (a replay reads and writes the addresses captured), and a frame
recorded once and replayed op by op over its own tensors (`_Tape`: what a graph
replay does, on CPU) equals the eager frame while sessions come and go. The
greedy step equals transformers' whole-sequence temporal transformer and depth
decoder. On CUDA, graph replay equals the eager frame (marked `gpu`, not in the default
suite: `pytest -m gpu tests/models/test_moshi_frame.py`).
"""

from __future__ import annotations

import inspect
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omni_actors.models.moshi.frame import MoshiFrame
from omni_actors.models.tiny import make_tiny

SLOTS = 3
FRAMES = 6
FRAME = 1920
HOST_SYNC_OPS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item", "lift_fresh"}
"""Ops that read a tensor's value on the host (or make one from host data): not allowed in a CUDA graph."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import MoshiForConditionalGeneration

    folder = make_tiny("moshi", tmp_path_factory.mktemp("moshi"))
    return MoshiForConditionalGeneration.from_pretrained(folder).eval()


class _HostSyncs(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_SYNC_OPS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _buffers(obj, seen: set[int] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor held by the frame's state objects (not the model's weights), by attribute path."""
    seen = set() if seen is None else seen
    out: dict[str, torch.Tensor] = {}
    if id(obj) in seen or isinstance(obj, torch.nn.Module):
        return out
    seen.add(id(obj))
    items = (obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple)
             else vars(obj).items() if hasattr(obj, "__dict__") else ())
    for key, value in items:
        if isinstance(value, torch.Tensor):
            out[str(key)] = value
        elif isinstance(value, list | tuple | dict) or (hasattr(value, "__dict__") and not inspect.isroutine(value)):
            out.update({f"{key}.{k}": v for k, v in _buffers(value, seen).items()})
    return out


class _Tape(TorchDispatchMode):
    """A CUDA graph's semantics on CPU: the first call runs and records every op with the very tensors it
    read and made; each later call re-runs those ops over the same tensors, writing each result into the
    tensor the recording made (fixed memory), with the Python decisions of the recording."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.forward = forward
        self.ops: list = []
        self.out = None
        self.enabled = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out

    def run(self, _batch: int, _length: int):
        if self.out is None:
            with self:
                self.out = self.forward()
            return self.out
        for func, args, kwargs, out in self.ops:
            if func.is_view:
                continue  # a view of recorded memory sees the new values as they are written
            new = func(*args, **kwargs)
            if not func._schema.is_mutable:  # an in-place op has written its target already
                _write(out, new)
        return self.out


def _write(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, list | tuple):
        for d, s in zip(dst, src, strict=True):
            _write(d, s)


def _audio(t: int) -> torch.Tensor:
    return torch.randn(SLOTS, FRAME, generator=torch.Generator().manual_seed(t)) * 0.2


def test_the_device_half_of_a_frame_has_no_host_syncs_and_writes_its_buffers_in_place(model) -> None:
    frame = MoshiFrame(model, SLOTS, graphs=False)
    frame.start(0, seed=1)
    frame.start(2, seed=2)
    buffers = _buffers(frame)
    assert {"audio_in", "lm.text_noise", "lm.stepped", "lm.ring.held", "mimi.up_tail.tail"} <= buffers.keys()
    assert len(buffers) > 50
    ptrs = {k: v.data_ptr() for k, v in buffers.items()}
    outputs = []
    with torch.no_grad():
        for t in range(FRAMES):
            frame.audio_in.copy_(_audio(t))
            frame.lm.prepare()
            with _HostSyncs() as spy:
                _text, audio = frame._forward()
            frame.lm.finish()
            assert spy.seen == [], f"host syncs in the captured region at frame {t}: {sorted(set(spy.seen))}"
            outputs.append(audio.clone())
    moved = [k for k, v in _buffers(frame).items() if k in ptrs and v.data_ptr() != ptrs[k]]
    assert moved == [], f"state reallocated instead of written in place: {moved}"
    assert not torch.equal(outputs[-1], outputs[-2]), "the state should advance frame by frame"


def test_a_frame_recorded_once_and_replayed_over_its_tensors_equals_the_eager_frame(model) -> None:
    eager, taped = MoshiFrame(model, SLOTS, graphs=False), MoshiFrame(model, SLOTS, graphs=False)
    taped.graphs = _Tape(taped._forward)
    for f in (eager, taped):
        f.start(0, seed=1)
        f.start(2, seed=2)
    texts = []
    for t in range(FRAMES * 2):
        if t == FRAMES:  # a session leaves, another joins: host-side resets between replays
            for f in (eager, taped):
                f.stop(0)
                f.start(1, seed=3)
        a_text, a_audio = eager.step(_audio(t))
        b_text, b_audio = taped.step(_audio(t))
        assert torch.equal(a_text, b_text), f"frame {t}"
        assert torch.equal(a_audio, b_audio), f"frame {t}"
        texts.append(b_text.clone())
    assert len(taped.graphs.ops) > 500 and taped.graphs.out is not None
    assert not torch.equal(texts[-1], texts[-2]) and b_audio[1].abs().sum() > 0, "replays should move on"


def test_a_greedy_frame_equals_transformers_whole_sequence_forward(model) -> None:
    """Teacher-forced with the step's own tokens, transformers' decoder and depth decoder pick the same ones."""
    cfg = model.config
    k = cfg.num_codebooks
    frame = MoshiFrame(model, SLOTS, graphs=False)
    frame.start(1, seed=0, text_temperature=0.0, audio_temperature=0.0)
    lm = frame.lm
    users, texts, codes = [], [], []
    with torch.no_grad():
        for t in range(FRAMES):
            user = torch.randint(0, cfg.audio_vocab_size, (SLOTS, k), generator=torch.Generator().manual_seed(t))
            lm.prepare()
            text, _frame, _ready = lm.forward(user)
            lm.finish()
            users.append(user[1])
            texts.append(int(text[1]))
            codes.append(lm.prev_model[1].clone())  # this step's codes, all codebooks
        # the inputs of step t: the model's text and codes of t - 1, the user's codebook 0 of t and 1.. of t - 1
        nothing = torch.full((k,), cfg.audio_vocab_size)
        embeds = []
        for t in range(FRAMES):
            prev_text = torch.tensor([texts[t - 1] if t else cfg.vocab_size])
            prev_codes = codes[t - 1] if t else nothing
            user = torch.cat([users[t][:1], users[t - 1][1:] if t else nothing[1:]])
            e = model.decoder.model.embed_tokens(prev_text[None])
            for i in range(k):
                e = e + model.embed_tokens[i](prev_codes[None, i : i + 1]) + model.embed_tokens[k + i](user[None, i : i + 1])
            embeds.append(e)
        hidden = model.decoder.model(inputs_embeds=torch.cat(embeds, dim=1)).last_hidden_state  # [1, T, D]
        assert model.decoder.lm_head(hidden)[0].argmax(-1).tolist() == texts
        for t in range(FRAMES):
            ids = torch.cat([torch.tensor([texts[t]]), codes[t][:-1]])[None]
            logits = model.depth_decoder(input_ids=ids, last_hidden_state=hidden[:, t : t + 1], use_cache=False).logits
            assert torch.equal(logits[0].argmax(-1), codes[t]), f"frame {t}"
    assert len(set(texts)) > 1 and len(torch.unique(torch.stack(codes))) > 1, "tokens should vary"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_the_eager_frame_on_cuda(model) -> None:
    gpu = model.to("cuda")
    try:
        eager, graphed = MoshiFrame(gpu, SLOTS, graphs=False), MoshiFrame(gpu, SLOTS, graphs=True)
        for f in (eager, graphed):
            f.start(0, seed=3)
            f.start(2, seed=4)
        for t in range(FRAMES * 2):
            if t == FRAMES:  # a session leaves, another joins: host-side resets between replays
                for f in (eager, graphed):
                    f.stop(0)
                    f.start(1, seed=5)
            a_text, a_audio = (x.clone() for x in eager.step(_audio(t).cuda()))
            b_text, b_audio = graphed.step(_audio(t).cuda())
            assert graphed.graphs_on and graphed.graphs.graphs, "the frame should replay a captured graph"
            assert torch.equal(a_text, b_text), f"frame {t}"
            torch.testing.assert_close(a_audio, b_audio, rtol=1e-5, atol=1e-5)
    finally:
        model.to("cpu")
