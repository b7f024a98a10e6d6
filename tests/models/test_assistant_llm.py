"""Measured quality of the assistant's converted SmolLM2 checkpoint: greedy factual answers.

The serving engine is vLLM; this checks the checkpoint `prepare` wrote (config,
weights, tokenizer, chat template) with plain transformers, greedy and short.
"""

from __future__ import annotations

import json

import pytest
from assistant_support import assistant_dir

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

MAX_NEW_TOKENS = 20
FACTS = [
    ("What is the capital of France?", "paris"),
    ("What is the capital of Japan?", "tokyo"),
    ("What is the chemical symbol for water?", "h2o"),
    ("What is the opposite of hot?", "cold"),
    ("Who wrote Romeo and Juliet?", "shakespeare"),
]


def test_checkpoint_layout(assistant_dir):
    llm = assistant_dir / "llm"
    config = json.loads((llm / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] == 64  # an attention head size vLLM's CPU backend supports
    assert "quantization_config" not in config
    assert (llm / "model.safetensors").stat().st_size > 100e6
    generation = json.loads((llm / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2]  # <|im_end|>: chat turns stop there


def test_greedy_factual_answers(assistant_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = assistant_dir / "llm"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    answers = []
    for question, _ in FACTS:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        answers.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    misses = [(q, word, a) for (q, word), a in zip(FACTS, answers, strict=True) if word not in a.lower()]
    assert not misses, misses
