"""The box both runners share (sandbox/box.py): fresh, randomly named and private; what comes out of it; how a job's
ending reads as a status, an audit record that could not leave included. And the docker runner's use of it, against a
stand-in Docker client (no daemon needed)."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelbot.paths import cache_dir, store_dir
from kernelbot.sandbox import docker_runner
from kernelbot.sandbox.box import Ending, box_env, close_box, open_box, outcome
from kernelbot.sandbox.confine import AUDIT_LOST, LOST_RECORDS

NAME = re.compile(r"kb-[0-9a-f]{16}")


def test_boxes_are_fresh_private_and_named_at_random_under_the_box_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_BOX_ROOT", str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    workdir = tmp_path / "verify_t0"
    boxes = [open_box({"kind": "noop", "task": "t0"}, workdir) for _ in range(3)]
    assert len(set(boxes)) == 3 and all(b.parent == (tmp_path / "root").resolve() for b in boxes)
    assert all(NAME.fullmatch(b.name) for b in boxes)  # nothing of the job or the work dir in the name
    assert all(stat.S_IMODE(b.stat().st_mode) == 0o700 for b in boxes)
    assert json.loads((boxes[0] / "job.json").read_text()) == {"kind": "noop", "task": "t0"}
    assert (boxes[0] / "tmp").is_dir() and workdir.is_dir()
    env = box_env(boxes[0])
    assert env["HOME"] == str(boxes[0]) and all(env[k].startswith(str(boxes[0] / "tmp"))
                                                 for k in ("TMPDIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"))


def test_closing_a_box_keeps_plain_outputs_refuses_planted_links_and_removes_it(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "outputs.pt").write_text("from the previous job")
    box = open_box({"kind": "noop"}, workdir)
    assert not (workdir / "outputs.pt").exists()  # a previous job's output never passes for this one's
    (box / "result.json").write_text("{}")
    (tmp_path / "secret").write_text("host file")
    (box / "outputs.pt").symlink_to(tmp_path / "secret")
    close_box(box, workdir)
    assert (workdir / "result.json").read_text() == "{}" and not (workdir / "outputs.pt").exists()
    assert not box.exists()


def _ended(tmp_path: Path, payload: Any, code: int | None, timed_out: bool = False, note: str = "") -> Any:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "stderr.txt").write_text("last words")
    if payload is not None:
        (tmp_path / "result.json").write_text(json.dumps(payload))
    records = b'{"kind": "network", "detail": "socket.connect"}\nnot json\n'
    return outcome(tmp_path, 30, Ending(timed_out, code, 1.5, records, note), ["runner"])


def test_an_ending_reads_as_the_same_status_for_either_runner(tmp_path):
    ok = _ended(tmp_path / "ok", {"protections": ["audit hook"]}, 0)
    assert (ok.status, ok.detail, ok.protections) == ("ok", "last words", ["runner", "audit hook"])
    assert ok.violations == [{"kind": "network", "detail": "socket.connect"}, {"kind": "garbled", "detail": "not json"}]
    assert _ended(tmp_path / "t", None, None, timed_out=True).detail == "no result after 30 s"
    assert _ended(tmp_path / "s", None, -9).detail.startswith("killed by SIGKILL\n")
    oom = _ended(tmp_path / "d", None, 137, note=" (out of memory)")
    assert (oom.status, oom.detail.splitlines()[0]) == ("crash", "killed by SIGKILL (out of memory)")
    assert _ended(tmp_path / "n", None, 0).detail.startswith("exit code 0, no result")
    assert _ended(tmp_path / "x", {"error": "bad module"}, 0).status == "error"


def test_a_job_that_ended_because_its_audit_record_could_not_leave_is_a_violation(tmp_path):
    lost = _ended(tmp_path, None, AUDIT_LOST)
    assert lost.status == "crash" and [v["kind"] for v in lost.violations] == ["network", "garbled", LOST_RECORDS]


# A process with the audit hook on a pipe: TAMPER runs, then an audited event, then the pipe's contents are printed.
AUDITED = """
import gc, os, sys
from kernelbot.sandbox.confine import Recorder, install_audit
r, w = os.pipe()
install_audit(Recorder(w, os.getcwd()))
saved = os.dup(w)
TAMPER
gc.get_objects()
os.dup2(saved, w)
os.close(w)
os.close(saved)
print(os.read(r, 4096).decode(), end="")
"""


@pytest.mark.parametrize("tamper", ["pass", "os.close(w)", "os.dup2(os.open(os.devnull, os.O_WRONLY), w)",
                                    "sys.modules['kernelbot.sandbox.confine'].Recorder.__call__ = lambda *a: None",
                                    "sys.modules['kernelbot.sandbox.confine']._os_write = lambda *a: 0"])
def test_an_audit_record_reaches_its_pipe_or_ends_the_process(tmp_path, tamper):
    """The fd closed or pointed elsewhere for a moment ends the process before the fd is put back; the recorder's
    class or module names replaced do not reach the hook."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(AUDITED).replace("TAMPER", tamper)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    if tamper.startswith("os."):
        assert (done.returncode, done.stdout) == (AUDIT_LOST, ""), done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["kind"] for line in done.stdout.splitlines()] == ["introspection"]


class _Containers:
    """Stands in for docker's client.containers: records each create and plays the harness that writes its result."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def create(self, tag: str, command: list[str], **kwargs: Any) -> Any:
        self.created.append(kwargs)
        box = Path(kwargs["working_dir"])

        def start() -> None:
            (box / "result.json").write_text(json.dumps({"protections": ["in a container"]}))

        return SimpleNamespace(start=start, wait=lambda timeout: {"StatusCode": 0}, reload=lambda: None,
                               attrs={"State": {"OOMKilled": False}}, logs=lambda **_: b"container log",
                               remove=lambda force: None)


def test_each_docker_job_gets_its_own_unpredictable_container_and_box_name(tmp_path, monkeypatch):
    pytest.importorskip("docker", reason="the Docker SDK is not installed (pip install 'kernelbot[docker]')")
    containers = _Containers()
    monkeypatch.setattr(docker_runner, "_engine", lambda: (SimpleNamespace(containers=containers), "kb-sandbox:t"))
    results = [docker_runner.run_job({"kind": "noop"}, tmp_path / "w", timeout=30) for _ in range(2)]
    assert [r.status for r in results] == ["ok", "ok"] and results[0].protections[-1] == "in a container"
    names = [c["name"] for c in containers.created]
    boxes = [Path(c["working_dir"]) for c in containers.created]
    assert len(set(names)) == 2 and all(NAME.fullmatch(n) for n in names)
    assert len(set(boxes)) == 2 and all(NAME.fullmatch(b.name) and not b.exists() for b in boxes)
    assert all((tmp_path / "w") not in b.parents for b in boxes)  # the box is not found through the work dir
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["result.json", "stderr.txt"]


def test_kernelbot_caches_are_found_from_one_root(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELBOT_CACHE", raising=False)
    monkeypatch.delenv("KERNELBOT_STORE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir("cpp") == tmp_path / ".cache" / "kernelbot" / "cpp"
    assert store_dir() == tmp_path / ".cache" / "kernelbot" / "store"
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path / "c"))
    from kernelbot.kernel_library import cpp_build, store

    assert cpp_build.cache_root() == tmp_path / "c" / "cpp" and store.store_root() == tmp_path / "c" / "store"
    monkeypatch.setenv("KERNELBOT_STORE", str(tmp_path / "s"))
    assert store.store_root() == tmp_path / "s"
