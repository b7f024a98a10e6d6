"""A background response run in a conversation and cancelled (or deleted) by another server on the same data
directory just before it ends: its end adds nothing to the conversation, as a cancelled response adds nothing,
and its row keeps saying what that server made it.

The other server looks at its row at most every ELSEWHERE_CHECK_S, so a short response can end between a
cancel and that look; this test takes that moment itself (the real stores on a real SQLite file, the
functions the two servers call), so the ordering is not left to timing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from omni_actors.api.conversations_store import ConversationStore
from omni_actors.api.responses_answer import Answer
from omni_actors.api.responses_background import cancel_elsewhere
from omni_actors.api.responses_schemas import ConversationRef, Response
from omni_actors.api.responses_store import ResponseStore
from omni_actors.orchestrator.outputs import TextOutput
from omni_actors.store import Store

FIRST = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}], "id": "msg_first"}
ASKED = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a b"}], "id": "msg_asked"}


@pytest.mark.parametrize("elsewhere", ["cancel", "delete"])
def test_a_background_response_stopped_elsewhere_as_it_ends_adds_nothing_to_its_conversation(
        tmp_path: Path, elsewhere: str) -> None:
    maker, other = Store(tmp_path), Store(tmp_path)  # two servers' connections to one data directory
    try:
        responses, conversations = ResponseStore(maker), ConversationStore(maker)
        cid, _ = conversations.create({}, [FIRST])
        base = Response(id="resp_1", created_at=int(time.time()), status="in_progress", model="synthetic",
                        output=[], background=True, conversation=ConversationRef(cid))
        conversation = [{"role": "user", "content": "a b"}]
        responses.add(base, conversation, [ASKED])
        answer = Answer(base, "msg_answer", conversation, [ASKED], responses)
        answer.joins = (conversations, cid, [ASKED])
        answer.tally.add_text(TextOutput("a b", 2, finish_reason="stop"))
        if elsewhere == "cancel":
            cancel_elsewhere(ResponseStore(other), "resp_1")
        else:
            ResponseStore(other).delete("resp_1")
        answer.finish()  # the maker's run ends before it looks at its row again
        assert [i["id"] for i in conversations.items(cid)] == ["msg_first"]
        found = responses.status("resp_1")
        assert (found[0] if found else None) == ("cancelled" if elsewhere == "cancel" else None)
    finally:
        maker.close()
        other.close()


def test_a_background_response_that_ends_adds_its_items_to_its_conversation(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        responses, conversations = ResponseStore(store), ConversationStore(store)
        cid, _ = conversations.create({}, [FIRST])
        base = Response(id="resp_2", created_at=int(time.time()), status="in_progress", model="synthetic",
                        output=[], background=True, conversation=ConversationRef(cid))
        responses.add(base, [], [ASKED])
        answer = Answer(base, "msg_answer", [], [ASKED], responses)
        answer.joins = (conversations, cid, [ASKED])
        answer.tally.add_text(TextOutput("a b", 2, finish_reason="stop"))
        assert answer.finish().status == "completed"
        assert [i["id"] for i in conversations.items(cid)] == ["msg_first", "msg_asked", "msg_answer"]
        assert responses.status("resp_2")[0] == "completed"  # type: ignore[index]
    finally:
        store.close()
