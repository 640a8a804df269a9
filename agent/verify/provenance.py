"""What a shared object is, by its content: its identity (its ELF build id, or for one built without, the SHA-256 of
its bytes), and whether that is the identity of a library installed on this machine.

Native code counts as the candidate's own where it was built for it, and where a file lies says nothing about that: a
copy of numpy's OpenBLAS in the candidate's box lies where its own builds lie. A copy keeps its identity (the linker
writes the build id from the object's content; a wheel's OpenBLAS has none, so its bytes are compared), so a shared
object under the candidate's places with an installed library's identity is that library. The parent reads every
installed library's identity once (the Python installation's packages and the system's library folders), kept in
kernelbot's cache until one of those folders changes, and hands the set to the runner.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import site
import struct
import sys
import sysconfig
from pathlib import Path

from kernelbot.paths import cache_dir

SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/opt")
_NT_GNU_BUILD_ID, _PT_NOTE = 3, 4
INDEX = "installed_libraries.json"


def identity(path: str) -> str | None:
    """"build-id:<hex>" of an ELF file with a build id, else "sha256:<hex>" of its bytes; None where unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _identity(path, st.st_ino, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _identity(path: str, inode: int, mtime_ns: int, size: int) -> str | None:
    """identity() of the file as it is now (its inode and version are the cache key)."""
    found = build_id(path)
    if found:
        return f"build-id:{found}"
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return f"sha256:{digest.hexdigest()}"


def build_id(path: str) -> str | None:
    """The GNU build id of a 64-bit little-endian ELF file (hex), or None when it has none or is no such file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            (phoff,), (phentsize, phnum) = struct.unpack_from("<Q", head, 32), struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for k in range(phnum):
                kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, k * phentsize)
                if kind == _PT_NOTE:
                    f.seek(offset)
                    found = _note_build_id(f.read(min(size, 1 << 16)))
                    if found:
                        return found
    except (OSError, struct.error):
        return None
    return None


def _note_build_id(notes: bytes) -> str | None:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
        desc = pos + 12 + ((namesz + 3) & ~3)
        if kind == _NT_GNU_BUILD_ID and notes[pos + 12:pos + 12 + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc:desc + descsz].hex()
        pos = desc + ((descsz + 3) & ~3)
    return None


def library_roots() -> list[str]:
    """Where installed libraries lie: this Python's packages and its own library folder, and the system's."""
    paths = sysconfig.get_paths()
    roots = [*site.getsitepackages(), paths["platlib"], paths["purelib"], os.path.join(sys.base_prefix, "lib"),
             *SYSTEM_LIBRARIES]
    return [r for r in dict.fromkeys(os.path.realpath(r) for r in roots) if os.path.isdir(r)]


def _fingerprint(roots: list[str]) -> list[list]:
    """Each root's and each of its folders' modification time: installing a package or a library changes one."""
    found = []
    for root in roots:
        for folder in [root, *(e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False))]:
            try:
                found.append([folder, os.stat(folder).st_mtime_ns])
            except OSError:
                continue
    return found


def _shared_objects(folder: str, found: list[str]) -> None:
    try:
        entries = os.scandir(folder)
    except OSError:
        return
    with entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    _shared_objects(entry.path, found)
                elif (entry.name.endswith(".so") or ".so." in entry.name) and entry.is_file():
                    found.append(entry.path)
            except OSError:
                continue


@functools.cache
def installed_libraries() -> frozenset[str]:
    """The identity of every shared object installed on this machine (library_roots), from kernelbot's cache while
    none of those folders changed."""
    roots = library_roots()
    fingerprint = _fingerprint(roots)
    index = cache_dir() / INDEX
    try:
        kept = json.loads(index.read_text())
        if kept["fingerprint"] == fingerprint:
            return frozenset(kept["identities"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files: list[str] = []
    for root in roots:
        _shared_objects(root, files)
    found = sorted({i for path in files if (i := identity(path))})
    _write(index, {"fingerprint": fingerprint, "identities": found})
    return frozenset(found)


def _write(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_text(json.dumps(data))
        os.replace(staged, path)
    except OSError:
        pass  # read-only cache: read again next time
