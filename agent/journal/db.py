"""The run's crash-safe journal: SQLite (WAL, synchronous=FULL) under the run directory, one transaction per
record, so a kill -9, a reboot or a full disk loses at most the record being written, never one before it.

`optimize` asks the journal before every stage, candidate and LLM call (`get`), and records each result as soon
as it exists (`put`); `optimize --resume` therefore replays what was done and continues from the first thing that
was not. A lock file holding the owner's PID (`flock`, released by the kernel when the process dies, so a killed
run never leaves a stale lock) refuses a second process on the same run directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError

JOURNAL = "journal.sqlite"
LOCK = "run.lock"
# Tests: SIGKILL this process in the middle of the Nth journal write (after the row is written, before the
# commit), to prove a torn write is rolled back and the run resumes from the record before it.
CRASH_ENV = "KERNELBOT_JOURNAL_CRASH_AT"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, kind TEXT NOT NULL, data TEXT NOT NULL,
                                    ts REAL NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, kind TEXT NOT NULL,
                                   message TEXT NOT NULL);
"""


class RunLocked(KernelbotError):
    """Another process holds the run directory."""


def lock_owner(run_dir: Path) -> int | None:
    """The PID of the live process holding the run directory, or None when nobody holds it."""
    path = run_dir / LOCK
    if not path.exists():
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            text = f.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


class Journal:
    def __init__(self, run_dir: Path, *, readonly: bool = False) -> None:
        self.run_dir, self.path = Path(run_dir), Path(run_dir) / JOURNAL
        self._lock_file = None
        self._writes = 0
        self._crash_at = int(os.environ.get(CRASH_ENV, "0") or 0)
        if readonly:
            if not self.path.exists():
                raise KernelbotError(f"{run_dir}: no {JOURNAL} here, so not a kernelbot run directory")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
            return
        self._lock()
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def _lock(self) -> None:
        self._lock_file = open(self.run_dir / LOCK, "a+")  # noqa: SIM115 - held for the journal's lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            pid = self._lock_file.read().strip() or "?"
            self._lock_file.close()
            raise RunLocked(f"run directory {self.run_dir} is in use by kernelbot process {pid}; "
                            f"watch it with `kernelbot status {self.run_dir}`") from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        os.fsync(self._lock_file.fileno())

    def close(self) -> None:
        self.db.close()
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes: one transaction each --------------------------------------------------------------------------
    def _write(self, sql: str, params: tuple) -> None:
        self._writes += 1
        try:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(sql, params)
            if self._crash_at and self._writes == self._crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if "full" in str(exc) or "disk" in str(exc):
                raise KernelbotError(f"the disk under {self.run_dir} is full ({exc}); free space and continue "
                                     f"with `kernelbot optimize --resume {self.run_dir}`") from None
            raise

    def put(self, key: str, kind: str, data: Any) -> None:
        """Record a result (JSON-serialisable); a key already recorded is replaced."""
        self._write("INSERT OR REPLACE INTO records (key, kind, data, ts, seq) VALUES (?, ?, ?, ?, "
                    "(SELECT COALESCE(MAX(seq), 0) + 1 FROM records))", (key, kind, json.dumps(data), time.time()))

    def set_meta(self, key: str, value: Any) -> None:
        self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def event(self, kind: str, message: str) -> None:
        self._write("INSERT INTO events (ts, kind, message) VALUES (?, ?, ?)", (time.time(), kind, message))

    # -- reads ---------------------------------------------------------------------------------------------------
    def get(self, key: str) -> Any | None:
        row = self.db.execute("SELECT data FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def has(self, pattern: str) -> bool:
        """Is there a record whose key matches this SQL LIKE pattern?"""
        return self.db.execute("SELECT 1 FROM records WHERE key LIKE ? LIMIT 1", (pattern,)).fetchone() is not None

    def meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def records(self, kind: str) -> list[tuple[str, Any]]:
        rows = self.db.execute("SELECT key, data FROM records WHERE kind = ? ORDER BY seq", (kind,)).fetchall()
        return [(k, json.loads(d)) for k, d in rows]

    def events(self, last: int = 20) -> list[tuple[float, str, str]]:
        rows = self.db.execute("SELECT ts, kind, message FROM events ORDER BY seq DESC LIMIT ?", (last,)).fetchall()
        return list(reversed(rows))

    def dump(self) -> dict[str, Any]:
        """Every record and meta value (the run's state, for comparing two runs)."""
        recs = {k: (kind, json.loads(d)) for k, kind, d in self.db.execute("SELECT key, kind, data FROM records")}
        meta = {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}
        return {"records": recs, "meta": meta}
