"""ToolCallReader: vLLM's tool parsers read function calls out of finished text, as plain dicts.

Real parsers on a real (tiny) tokenizer, fed the texts a model of each format
writes; the engine test (test_vllm_engine.py) shows the tools reach the template.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from omni_actors.workers.engines.tool_calls import ToolCallReader

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model("llama"))


@pytest.mark.parametrize(("parser", "text", "content"), [
    pytest.param("hermes", 'Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
                 "</tool_call>", "Let me look.", id="hermes"),
    pytest.param("pythonic", '[get_weather(city="Paris")]', None, id="pythonic"),
])
def test_a_call_is_read_as_openai_function_call(tokenizer, parser: str, text: str, content: str | None) -> None:
    got_content, calls = ToolCallReader(parser, tokenizer).read(text, TOOLS)
    assert got_content == content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert all(isinstance(c["id"], str) and c["id"] for c in calls)


def test_two_calls_get_distinct_ids(tokenizer) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    _, calls = ToolCallReader("hermes", tokenizer).read(call % "Paris" + call % "Oslo", TOOLS)
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Oslo"]
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("parser", ["hermes", "pythonic"])
def test_text_without_a_valid_call_is_content(tokenizer, parser: str) -> None:
    for text in ("It is sunny in Paris.", "<tool_call>{not json</tool_call>"):
        assert ToolCallReader(parser, tokenizer).read(text, TOOLS) == (text, [])


@pytest.mark.parametrize(("parser", "pieces", "shown"), [
    pytest.param("hermes", ["Let me ", "look.", "<tool", '_call>{"name": "get_weather", ', '"arguments": {"city": ',
                            '"Paris"}}</tool_call>', " Done."], "Let me look.", id="hermes-call"),
    pytest.param("hermes", ["It is ", "sunny ", "in Paris", ". <to"], "It is sunny in Paris. ", id="hermes-prose"),
    pytest.param("pythonic", ["[get_", 'weather(city="Paris")]'], "", id="pythonic-call"),
    pytest.param("pythonic", ["It is ", "sunny."], "It is sunny.", id="pythonic-prose"),
])
def test_what_streams_before_the_answer_is_read_is_never_part_of_a_call(tokenizer, parser: str, pieces: list[str],
                                                                         shown: str) -> None:
    reader = ToolCallReader(parser, tokenizer)
    stream = reader.shown(TOOLS)
    got = [stream.feed(p, tokenizer.encode(p, add_special_tokens=False)) for p in pieces]
    assert "".join(text for text, _ in got) == shown
    content, calls = reader.read("".join(pieces), TOOLS)
    # What was shown is where the finished reading's content starts (a call's text never is).
    assert (content or "").startswith(shown)
    assert stream.done == bool(calls)  # a call seen streaming stopped the showing
    # The call's pieces as they came: its id and name first, then its arguments' text.
    parts = [p for _, ps in got for p in ps]
    if calls:
        assert parts[0]["index"] == 0 and parts[0]["name"] == "get_weather" and parts[0]["id"]
        assert json.loads("".join(p.get("arguments", "") for p in parts)) == json.loads(calls[0]["arguments"])
        assert {p["index"] for p in parts} == {0}
    else:
        assert parts == []


def test_a_calls_arguments_stream_in_pieces_as_the_model_writes_them(tokenizer) -> None:
    stream = ToolCallReader("hermes", tokenizer).shown(TOOLS)
    pieces = ["<tool_call>", '{"name": "get_weather", "arguments": ', '{"city": "Pa', 'ris"}}', "</tool_call>"]
    got = [stream.feed(p, tokenizer.encode(p, add_special_tokens=False))[1] for p in pieces]
    args = ["".join(p.get("arguments", "") for p in ps) for ps in got]
    assert [p.get("name") for ps in got for p in ps if "name" in p] == ["get_weather"]
    assert sum(1 for a in args if a) >= 2, got  # not one block at the end
    assert json.loads("".join(args)) == {"city": "Paris"}


def test_an_unknown_parser_is_named(tokenizer) -> None:
    with pytest.raises(ValueError, match="no_such_parser"):
        ToolCallReader("no_such_parser", tokenizer)


def test_a_parser_the_tokenizer_cannot_serve_fails_at_start(tokenizer) -> None:
    """llama3_json needs Llama 3's `<|python_tag|>` token, which this tokenizer lacks."""
    with pytest.raises(ValueError, match=r"llama3_json.*tokenizer"):
        ToolCallReader("llama3_json", tokenizer)
