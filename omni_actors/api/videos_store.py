"""Video jobs in the data directory: their SQLite tables (through `omni_actors.store`) and their files.

    video_jobs(id, model, prompt, size, seconds, status, progress, created_at, completed_at,
               error_code, error_message, error_param, owner_pid, has_audio,
               request, seed, remixed_from)
    video_cursors(id, created_at)    where deleted jobs stood, so `after` may name one

`request` is what the job was made from beyond its prompt (JSON: frames, steps, guidance,
negative prompt), `seed` the seed it ran with, `remixed_from` the job a remix started
from: a remix makes the same video again with a new prompt. Files:
`<data>/state/files/videos/<id>.mp4`, `<id>.jpg` (thumbnail) and `<id>.sprites.jpg` (spritesheet), written by the job runner
to a temporary name and renamed, so a file that exists is whole; `<id>.ref.png`, a first
frame the job was given (a remix of it starts from the same frame); `<id>.source.mp4`,
the video an extension continues (a hard link to, or a copy of, the source job's MP4,
or the upload), kept while the job runs: its finished MP4 holds those frames. A job's
row is what `retrieve`/`list` answer; its status only moves forward
(queued -> in_progress -> completed | failed). Jobs a server lost (its process is
gone, the row still queued or in_progress) are marked failed by `fail_orphans`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_actors.store import Store, owned_elsewhere, owner_token

FEATURE = "videos"
DDL = (
    """CREATE TABLE IF NOT EXISTS video_jobs (
        id TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        prompt TEXT,
        size TEXT NOT NULL,
        seconds TEXT NOT NULL,
        status TEXT NOT NULL,
        progress INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        completed_at INTEGER,
        error_code TEXT,
        error_message TEXT,
        error_param TEXT,
        owner_pid INTEGER NOT NULL,
        has_audio INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS video_jobs_created ON video_jobs (created_at, id)",
    # Where deleted jobs stood in the list: a client paging with `after` = a job it just deleted
    # (the SDK's auto-pagination while deleting what it lists) carries on from that place.
    "CREATE TABLE IF NOT EXISTS video_cursors (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL)",
)
ADDED = {"request": "TEXT", "seed": "INTEGER", "remixed_from": "TEXT"}
"""Columns added after the table's first release (Store.add_columns)."""
RUNNING = ("queued", "in_progress")
VARIANTS = {"video": ".mp4", "thumbnail": ".jpg", "spritesheet": ".sprites.jpg"}
FILES = {**VARIANTS, "reference": ".ref.png", "source": ".source.mp4"}


def new_job_id() -> str:
    """`video_` + the time in ns (16 hex digits) + 16 random ones: the list's order within one second
    of `created_at` (by id) is then the order jobs were made in."""
    return f"video_{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class JobRow:
    id: str
    model: str
    prompt: str | None
    size: str
    seconds: str
    status: str
    progress: int
    created_at: int
    completed_at: int | None
    error_code: str | None
    error_message: str | None
    error_param: str | None
    has_audio: bool
    request: dict[str, Any] | None = None
    """What the job was made from beyond its prompt (None for jobs from before remix)."""
    seed: int | None = None
    remixed_from: str | None = None


class VideoStore:
    """The video job table and file folder of one data directory."""

    def __init__(self, store: Store) -> None:
        self.db = store
        store.ensure(FEATURE, DDL)
        store.add_columns("video_jobs", ADDED)
        self.folder = store.files(FEATURE)

    def path(self, job_id: str, variant: str = "video") -> Path:
        return self.folder / f"{job_id}{FILES[variant]}"

    def insert(self, job_id: str, model: str, prompt: str, size: str, seconds: str,
               request: dict[str, Any] | None = None, remixed_from: str | None = None) -> None:
        self.db.execute(
            "INSERT INTO video_jobs (id, model, prompt, size, seconds, status, created_at, owner_pid, "
            "request, remixed_from) VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
            (job_id, model, prompt, size, seconds, int(time.time()), owner_token(),
             None if request is None else json.dumps(request), remixed_from),
        )

    def progress(self, job_id: str, percent: int) -> None:
        self.db.execute(
            "UPDATE video_jobs SET status = 'in_progress', progress = MAX(progress, ?) "
            "WHERE id = ? AND status IN ('queued', 'in_progress')",
            (percent, job_id),
        )

    def complete(self, job_id: str, has_audio: bool, seed: int | None = None) -> bool:
        return self.db.execute(
            "UPDATE video_jobs SET status = 'completed', progress = 100, completed_at = ?, has_audio = ?, "
            "seed = ? WHERE id = ? AND status IN ('queued', 'in_progress')",
            (int(time.time()), int(has_audio), seed, job_id),
        ) == 1

    def fail(self, job_id: str, code: str, message: str, param: str | None = None) -> None:
        self.db.execute(
            "UPDATE video_jobs SET status = 'failed', completed_at = ?, error_code = ?, error_message = ?, "
            "error_param = ? WHERE id = ? AND status IN ('queued', 'in_progress')",
            (int(time.time()), code, message, param, job_id),
        )

    def get(self, job_id: str) -> JobRow | None:
        row = self.db.query_one("SELECT * FROM video_jobs WHERE id = ?", (job_id,))
        return _row(row) if row is not None else None

    def page(self, after: str | None, limit: int, order: str) -> tuple[list[JobRow], bool]:
        """Up to `limit` jobs after the job `after` (by creation), and whether more follow."""
        desc = order == "desc"
        where, params = "", []
        if after is not None:
            anchor = (self.db.query_one("SELECT created_at FROM video_jobs WHERE id = ?", (after,))
                      or self.db.query_one("SELECT created_at FROM video_cursors WHERE id = ?", (after,)))
            if anchor is None:
                raise KeyError(after)
            cmp = "<" if desc else ">"
            where = f"WHERE (created_at, id) {cmp} (?, ?)"
            params = [anchor["created_at"], after]
        direction = "DESC" if desc else "ASC"
        rows = self.db.query(
            f"SELECT * FROM video_jobs {where} ORDER BY created_at {direction}, id {direction} LIMIT ?",
            (*params, limit + 1),
        )
        return [_row(r) for r in rows[:limit]], len(rows) > limit

    def delete(self, job_id: str, listed: bool = True) -> bool:
        """Remove a job's row and files; `listed`: it may have been listed, so keep its place as a cursor."""
        if listed:
            self.db.execute("INSERT OR IGNORE INTO video_cursors (id, created_at) "
                            "SELECT id, created_at FROM video_jobs WHERE id = ?", (job_id,))
        gone = self.db.execute("DELETE FROM video_jobs WHERE id = ?", (job_id,)) == 1
        for variant in FILES:
            self.path(job_id, variant).unlink(missing_ok=True)
        return gone

    def fail_orphans(self) -> list[str]:
        """Mark failed every unfinished job whose server process is gone; return their ids."""
        rows = self.db.query(
            "SELECT id, owner_pid FROM video_jobs WHERE status IN ('queued', 'in_progress')"
        )
        lost = [r["id"] for r in rows if not owned_elsewhere(r["owner_pid"])]
        for job_id in lost:
            self.fail(job_id, "server_restarted",
                      "the server stopped while this video was being generated; create it again")
            for variant in FILES:  # and the half-written `.part` files of a server killed mid-write
                path = self.path(job_id, variant)  # (those stayed for good before 2026-12-05)
                path.unlink(missing_ok=True)
                path.with_name(path.name + ".part").unlink(missing_ok=True)
        return lost


def _row(row: Any) -> JobRow:
    return JobRow(
        id=row["id"], model=row["model"], prompt=row["prompt"], size=row["size"], seconds=row["seconds"],
        status=row["status"], progress=row["progress"], created_at=row["created_at"],
        completed_at=row["completed_at"], error_code=row["error_code"], error_message=row["error_message"],
        error_param=row["error_param"], has_audio=bool(row["has_audio"]),
        request=None if row["request"] is None else json.loads(row["request"]), seed=row["seed"],
        remixed_from=row["remixed_from"],
    )
