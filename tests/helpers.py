import contextlib
import json
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path


def write_module(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


@contextlib.contextmanager
def loopback_listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on 127.0.0.1 for the length of the block: (its port, what reached it)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            received.append(conn.recv(100) or b"<connected>")
            conn.close()

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        yield server.getsockname()[1], received
    finally:
        stop.set()
        listener.join()
        server.close()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_closed(port: int) -> bool:
    """Nothing listens on the loopback port (a server the test started has stopped)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def recorded_candidates(run_dir: Path) -> dict[str, dict]:
    """The candidate records a run's journal holds (read-only; none while the journal does not exist yet)."""
    if not (run_dir / "journal.sqlite").exists():
        return {}
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return {k: json.loads(d) for k, d in db.execute("SELECT key, data FROM records WHERE kind = 'candidate'")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
