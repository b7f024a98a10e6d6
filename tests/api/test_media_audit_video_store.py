"""Video jobs a killed server left behind: the restarted server fails them and removes all of their files."""

from __future__ import annotations

import subprocess
import sys

from omni_actors.api.videos_store import FILES, VideoStore
from omni_actors.store import Store


def _gone_pid() -> int:
    """The pid of a process that has exited (a row's bare-pid owner: a server that is gone)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_job_lost_mid_write_leaves_no_part_files(tmp_path) -> None:
    """The job runner writes each file to `<name>.part` and renames it: a server killed during the MP4
    encode (seconds to minutes for a long video) left those behind, and `fail_orphans` removed only the
    finished names, so the half-written MP4 stayed in the data directory for good."""
    store = Store(tmp_path)
    jobs = VideoStore(store)
    jobs.insert("video_lost", "m", "a cat", "32x32", "1")
    jobs.progress("video_lost", 95)
    store.execute("UPDATE video_jobs SET owner_pid = ? WHERE id = 'video_lost'", (_gone_pid(),))
    for variant in FILES:
        path = jobs.path("video_lost", variant)
        path.write_bytes(b"x")
        path.with_name(path.name + ".part").write_bytes(b"half")
    assert jobs.fail_orphans() == ["video_lost"]
    row = jobs.get("video_lost")
    assert row is not None and (row.status, row.error_code) == ("failed", "server_restarted")
    assert sorted(p.name for p in jobs.folder.iterdir()) == []
    store.close()
