import os
import shutil
import tempfile
from pathlib import Path

# Triton kernels run on the CPU through Triton's interpreter; it must be chosen before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture
def shared_data() -> Path:
    data = SHARED / "data"
    if not data.is_dir():
        pytest.skip(f"{data} is absent: the shared test data sits beside the project checkout")
    return data


@pytest.fixture(scope="session")
def docker_daemon():
    """(client, directory holding docker.sock): a real dockerd of this session's own, or a skip saying why not."""
    from docker_helpers import missing_reason, start_dockerd, stop

    reason = missing_reason(("dockerd",))
    if reason:
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="kbd", dir="/tmp"))  # short: containerd's socket path must fit
    try:
        proc, client = start_dockerd(tmp)
    except RuntimeError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(str(exc))
    try:
        yield client, tmp
    finally:
        client.close()
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def docker_env(docker_daemon):
    """(client, registry host:port, directory holding docker.sock), with a busybox base image `kb-base:1`."""
    from docker_helpers import busybox_rootfs, missing_reason, start_registry, stop

    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    client, tmp = docker_daemon
    try:
        proc, registry = start_registry(tmp)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        client.api.import_image_from_data(busybox_rootfs(), repository="kb-base", tag="1")
        yield client, registry, tmp
    finally:
        stop(proc)


@pytest.fixture
def one_cpp_candidate(monkeypatch):
    """Candidate generation cut to the first C++ candidate of each task (the proposer has tests of its own)."""
    from kernelbot.agent.propose import proposer

    real = proposer.propose
    monkeypatch.setattr("kernelbot.agent.generate.propose",
                        lambda task, backends, reference: [c for c in real(task, backends, reference)
                                                           if c[0].backend == "cpp"][:1])
