"""A response a gone server left unfinished, met first as a `previous_response_id` after a restart: it reads
failed there too (as a retrieve reads it), so the chain continues, rather than a 400 saying to wait for an
end that no server will ever write.

The synthetic pipeline behind a real server on a data directory whose row a gone process owns (a pid that has
ended), through the unmodified openai SDK."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from omni_actors.api.responses_schemas import Response
from omni_actors.api.responses_store import ResponseStore
from omni_actors.store import Store
from tests.api.test_responses import serve_with_store


def _left_by_a_gone_server(data: Path, rid: str, background: bool) -> None:
    gone = subprocess.Popen(["true"])  # a pid that has ended
    gone.wait()
    store = Store(data)
    try:
        left = Response(id=rid, created_at=int(time.time()), status="in_progress", model="synthetic", output=[],
                        background=background)
        ResponseStore(store).add(left, [{"role": "user", "content": "earlier"}], [])
        store.execute("UPDATE responses SET owner_pid = ? WHERE id = ?", (gone.pid, rid))
    finally:
        store.close()


async def test_a_response_a_gone_server_left_unfinished_can_be_continued(tmp_path: Path) -> None:
    _left_by_a_gone_server(tmp_path, "resp_left_streamed", background=False)  # (a foreground stream's row)
    _left_by_a_gone_server(tmp_path, "resp_left_background", background=True)
    async with serve_with_store(tmp_path) as client:
        for rid in ("resp_left_streamed", "resp_left_background"):
            follow = await client.responses.create(model="synthetic", input="next", max_output_tokens=1,
                                                   previous_response_id=rid)
            assert (follow.status, follow.output_text, follow.previous_response_id) == ("completed", "next", rid)
            left = await client.responses.retrieve(rid)
            assert (left.status, left.error.code) == ("failed", "server_error"), left.error
