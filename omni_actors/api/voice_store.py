"""Custom voices and their consent recordings in the data directory's SQLite store (store.py).

    voice_consents(id "cons_...", name, language, created_at, file)
    voices(id "voice_...", name, consent_id -> voice_consents, created_at, file, transcript)
    voice_consent_cursors(id, seq)   where deleted consents stood (their rowid), so `after` may name one

Audio lives beside the database under `files("voices")`: a consent's recording
as uploaded, a voice's sample as 16-bit WAV at its own rate. A consent that a
voice uses cannot be deleted (`ConsentInUse`, a 409 at the API). Files are
written before their row and removed after it, so a crash leaves at worst an
orphan file, never a row without its audio.
"""

from __future__ import annotations

import io
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from omni_actors.store import Store, get_store

FEATURE = "voices"
DDL = (
    "CREATE TABLE IF NOT EXISTS voice_consents (id TEXT PRIMARY KEY, name TEXT NOT NULL, "
    "language TEXT NOT NULL, created_at INTEGER NOT NULL, file TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS voices (id TEXT PRIMARY KEY, name TEXT NOT NULL, "
    "consent_id TEXT NOT NULL REFERENCES voice_consents(id), created_at INTEGER NOT NULL, "
    "file TEXT NOT NULL, transcript TEXT NOT NULL DEFAULT '')",
    # Where deleted consents stood in the list (their rowid): a client paging with `after` = a consent it
    # just deleted goes on from there rather than a 400.
    "CREATE TABLE IF NOT EXISTS voice_consent_cursors (id TEXT PRIMARY KEY, seq INTEGER NOT NULL)",
)


class ConsentInUse(Exception):
    def __init__(self, consent_id: str, voices: list[str]) -> None:
        super().__init__(f"consent {consent_id} is used by voice(s) {', '.join(voices)}; delete them first")


@dataclass(frozen=True)
class Consent:
    id: str
    name: str
    language: str
    created_at: int


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    consent_id: str
    created_at: int
    transcript: str


class VoiceStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)
        self.dir: Path = self.store.files(FEATURE)

    # ---- consents ------------------------------------------------------------------

    def add_consent(self, name: str, language: str, recording: bytes) -> Consent:
        cid = f"cons_{secrets.token_hex(12)}"
        file = f"{cid}.audio"
        (self.dir / file).write_bytes(recording)
        now = int(time.time())
        # rowid past every deleted consent's too, so a cursor left by one never hides a newer consent
        self.store.execute(
            "INSERT INTO voice_consents (rowid, id, name, language, created_at, file) VALUES (1 + MAX("
            "COALESCE((SELECT MAX(rowid) FROM voice_consents), 0), "
            "COALESCE((SELECT MAX(seq) FROM voice_consent_cursors), 0)), ?, ?, ?, ?, ?)",
            (cid, name, language, now, file))
        return Consent(cid, name, language, now)

    def consent(self, cid: str) -> Consent | None:
        row = self.store.query_one(
            "SELECT id, name, language, created_at FROM voice_consents WHERE id = ?", (cid,))
        return Consent(*row) if row else None

    def consents(self, after: str | None, limit: int) -> tuple[list[Consent], bool]:
        """A page in creation order after the consent `after` (a live or a deleted one); (page, has_more).
        KeyError if `after` names no consent that ever was."""
        start = 0 if after is None else self.store.cursor("voice_consents", "voice_consent_cursors", after)
        rows = self.store.query(
            "SELECT id, name, language, created_at FROM voice_consents WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (start, limit + 1))
        page = [Consent(*r) for r in rows]
        return page[:limit], len(page) > limit

    def rename_consent(self, cid: str, name: str) -> Consent | None:
        if not self.store.execute("UPDATE voice_consents SET name = ? WHERE id = ?", (name, cid)):
            return None
        return self.consent(cid)

    def delete_consent(self, cid: str) -> bool:
        users = [r[0] for r in self.store.query("SELECT id FROM voices WHERE consent_id = ?", (cid,))]
        if users:
            raise ConsentInUse(cid, users)
        row = self.store.query_one("SELECT file, rowid FROM voice_consents WHERE id = ?", (cid,))
        if row is None:
            return False
        try:
            self.store.execute("DELETE FROM voice_consents WHERE id = ?", (cid,))
            self.store.execute("INSERT OR IGNORE INTO voice_consent_cursors VALUES (?, ?)", (cid, row[1]))
        except sqlite3.IntegrityError:  # a voice took it meanwhile
            raise ConsentInUse(cid, ["(new)"]) from None
        (self.dir / row[0]).unlink(missing_ok=True)
        return True

    # ---- voices --------------------------------------------------------------------

    def add_voice(self, name: str, consent_id: str, audio: np.ndarray, rate: int, transcript: str) -> Voice:
        vid = f"voice_{secrets.token_hex(12)}"
        file = f"{vid}.wav"
        buf = io.BytesIO()
        sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
        (self.dir / file).write_bytes(buf.getvalue())
        now = int(time.time())
        try:
            self.store.execute("INSERT INTO voices VALUES (?, ?, ?, ?, ?, ?)",
                               (vid, name, consent_id, now, file, transcript))
        except sqlite3.IntegrityError:  # the consent went away meanwhile
            (self.dir / file).unlink(missing_ok=True)
            raise KeyError(consent_id) from None
        return Voice(vid, name, consent_id, now, transcript)

    def voice(self, vid: str) -> Voice | None:
        row = self.store.query_one(
            "SELECT id, name, consent_id, created_at, transcript FROM voices WHERE id = ?", (vid,))
        return Voice(*row) if row else None

    def voices(self) -> list[Voice]:
        rows = self.store.query("SELECT id, name, consent_id, created_at, transcript FROM voices ORDER BY rowid")
        return [Voice(*r) for r in rows]

    def clip(self, vid: str) -> tuple[np.ndarray, int]:
        """A voice's sample: (float32 mono, rate); KeyError for an unknown voice, OSError for a sample file
        that is gone or unreadable (removed or damaged on disk). Blocking file I/O: call it off the loop."""
        row = self.store.query_one("SELECT file FROM voices WHERE id = ?", (vid,))
        if row is None:
            raise KeyError(vid)
        try:
            audio, rate = sf.read(self.dir / row[0], dtype="float32", always_2d=True)
        except sf.LibsndfileError as err:  # libsndfile's own error, not an OSError, even for a missing file
            raise OSError(f"the sample of voice {vid} cannot be read: {err.error_string}") from None
        return np.ascontiguousarray(audio.mean(axis=1)), int(rate)

    def delete_voice(self, vid: str) -> bool:
        row = self.store.query_one("SELECT file FROM voices WHERE id = ?", (vid,))
        if row is None or not self.store.execute("DELETE FROM voices WHERE id = ?", (vid,)):
            return False
        (self.dir / row[0]).unlink(missing_ok=True)
        return True
