"""The Docker runner: the same job as the process runner, in a throwaway container.

The box is the process runner's (sandbox/box.py); this module only confines and starts the job in a container, named
at random like the box. The image is nearly empty (a passwd file and the host's /bin, /lib... symlinks, imported
once and tagged by its content); the host's runtime comes in through read-only bind mounts (/usr, the Python
installation, the venv, kernelbot's package folders as kernelbot/packages.py lists them, the job's input files). The
box is the only writable mount, at the same path as on the host, so job.json, HOME and TMPDIR mean the same inside.
The root filesystem is read-only, there is no network, no capability, no new privilege, memory and process counts are
capped by cgroups, and the candidate runs as nobody (or as the calling user when that is not root). Audit records go
through a FIFO that is mounted write-only for the container: the candidate can add records but not read them back.
Through the Docker SDK: no CLI process per job, structured errors, and the env never on a command line.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError
from kernelbot.packages import package_folders
from kernelbot.sandbox import box
from kernelbot.sandbox.gpu import visible_gpu

RUNNERS = ("auto", "process", "docker")
LABEL = "org.kernelbot.sandbox"  # value: host:pid of the kernelbot that started the container
NOBODY = 65534
AUDIT_TARGET = "/.kernelbot/audit"
# Runs first in the container: opens the audit FIFO for writing, hands it to the harness as KERNELBOT_AUDIT_FD.
LAUNCH = ("import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.set_inheritable(fd, True); "
          "os.environ['KERNELBOT_AUDIT_FD'] = str(fd); os.execvp(sys.argv[2], sys.argv[2:])")
_ready: dict[str, tuple[float, Any, str]] = {}  # DOCKER_HOST -> (when, client or None, image tag or reason)


def choose(runner: str | None) -> str:
    """'process' or 'docker' for `runner` (or $KERNELBOT_SANDBOX; default auto: docker when usable)."""
    name = runner or os.environ.get("KERNELBOT_SANDBOX") or "auto"
    if name not in RUNNERS:
        raise KernelbotError(f"unknown sandbox runner {name!r} (KERNELBOT_SANDBOX): use auto, process or docker")
    if name == "process":
        return "process"
    client, detail = _engine()
    if client is None and name == "docker":
        raise KernelbotError(f"the docker sandbox runner is unavailable: {detail}")
    return "docker" if client is not None else "process"


def _engine() -> tuple[Any, str]:
    """(client, image tag) for the daemon DOCKER_HOST names, or (None, why not); a failure is retried after 60 s."""
    host = os.environ.get("DOCKER_HOST", "")
    when, client, detail = _ready.get(host, (0.0, None, ""))
    if client is not None or time.monotonic() - when < 60:
        return client, detail
    client, detail = None, "no Docker daemon reachable (DOCKER_HOST or /var/run/docker.sock)"
    if host or Path("/var/run/docker.sock").exists():
        try:
            import docker
        except ImportError:
            detail = "the Docker SDK is not installed (pip install 'kernelbot[docker]')"
        else:
            try:
                client = docker.from_env(timeout=60)
                client.ping()
                _sweep(client)
                detail = _image(client)
            except Exception as exc:
                client, detail = None, f"{detail}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    _ready[host] = (time.monotonic(), client, detail)
    return client, detail


def _image(client: Any) -> str:
    """Tag of the base image (imported now unless the daemon has it): the host's top-level symlinks and a
    passwd that knows nobody, so that libraries looking up the user do not fail."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def add(name: str, kind: bytes, text: str = "", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.size = kind, link, 0o755 if kind != tarfile.REGTYPE else 0o644, \
                len(text)
            tar.addfile(info, io.BytesIO(text.encode()) if text else None)
        add("etc", tarfile.DIRTYPE)
        add("etc/passwd", tarfile.REGTYPE, f"root:x:0:0::/root:/bin/sh\nnobody:x:{NOBODY}:{NOBODY}::/:/bin/false\n")
        add("etc/group", tarfile.REGTYPE, f"root:x:0:\nnogroup:x:{NOBODY}:\n")
        for name in _top_level():
            if os.path.islink(f"/{name}"):
                add(name, tarfile.SYMTYPE, link=os.readlink(f"/{name}"))
    tag = f"kernelbot-sandbox:{hashlib.sha256(data.getvalue()).hexdigest()[:12]}"
    try:
        client.images.get(tag)
    except Exception:
        client.api.import_image_from_data(data.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    return tag


def _top_level() -> list[str]:
    return [n for n in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{n}")]


def _sweep(client: Any) -> None:
    """Remove containers left by a kernelbot on this host that was killed while a job ran."""
    me = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        host, _, pid = container.labels.get(LABEL, "").rpartition(":")
        if host == me and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            container.remove(force=True)


def _mounts(job: dict[str, Any], env: dict[str, str], folder: Path, audit: Path) -> list[Any]:
    """Read-only: system directories, the Python installation, kernelbot's packages, and every absolute path the job
    or the caller's env names (files one by one, not their directories). Read-write: the box only."""
    from docker.types import Mount

    paths = {Path(p) for p in ("/usr", "/etc/ld.so.cache", "/etc/alternatives", *(f"/{n}" for n in _top_level()))
             if not os.path.islink(p)}
    paths |= {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path)}
    paths |= set(package_folders())
    values: list[Any] = [*job.values(), *env.values()]
    while values:
        value = values.pop()
        if isinstance(value, (list, tuple)):
            values += value
        elif isinstance(value, str) and value.startswith("/"):
            paths.add(Path(value))
    kept: list[Path] = []
    for path in sorted(p for p in paths if p.is_absolute() and p.exists() and folder not in (p.resolve(),
                                                                                       *p.resolve().parents)):
        if not any(parent in kept for parent in path.parents):
            kept.append(path)
    mounts = [Mount(str(p), str(p), type="bind", read_only=True) for p in kept]
    mounts.append(Mount(str(folder), str(folder), type="bind", read_only=False))
    mounts.append(Mount(AUDIT_TARGET, str(audit), type="bind", read_only=True))  # a FIFO: writable even so
    return mounts


def run_job(job: dict[str, Any], workdir: Path, timeout: float, env: dict[str, str] | None = None,
            wrapper: list[str] | None = None, gpu: int | None = None, address_limit: bool = True) -> box.SandboxResult:
    """runner.run_job, in a container: same box, same result files, same statuses, same GPU health check."""
    import docker

    client, tag = _engine()
    if client is None:
        raise KernelbotError(f"the docker sandbox runner is unavailable: {tag}")
    workdir = workdir.resolve()
    folder = box.open_box(job, workdir)
    (workdir / "audit.fifo").unlink(missing_ok=True)
    uid, gid = (NOBODY, NOBODY) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    for path in (folder, folder / "tmp", folder / "job.json"):
        os.chown(path, uid, gid)
    audit = workdir / "audit.fifo"
    os.mkfifo(audit)
    audit_fd = os.open(audit, os.O_RDWR | os.O_NONBLOCK)  # a writer of our own: the container's never sees EOF
    os.chmod(audit, 0o200 if uid == os.getuid() else 0o002)  # the container may write, never read
    environment, device = _environment(job, folder, env, gpu)
    memory = box.memory_limit()
    limited = address_limit and device is None
    protections = _protections(tag, timeout, memory, uid, device, limited)
    command = [sys.executable, "-c", LAUNCH, AUDIT_TARGET, *(wrapper or []), sys.executable, *box.HARNESS_ARGS,
               "job.json"]
    records, stop = bytearray(), threading.Event()
    reader = threading.Thread(target=box.drain_records, args=(audit_fd, stop, records), daemon=True)
    reader.start()
    # no address-space limit on a GPU job or an AddressSanitizer one: the CUDA driver and ASan reserve virtual ranges
    # far beyond any memory limit (the cgroup's memory limit still holds)
    ulimits = [docker.types.Ulimit(name=n, soft=v, hard=v) for n, v in
               ((("as", memory),) if limited else ()) +
               (("fsize", box.MAX_FILE_BYTES), ("core", 0), ("cpu", int(timeout) + 5))]
    ecc_before = None
    if gpu is not None:
        from kernelbot.sandbox.gpu import check_health, ecc_errors

        ecc_before = ecc_errors(gpu)
    gpus = [docker.types.DeviceRequest(device_ids=[device], capabilities=[["gpu"]])] if device is not None else []
    t0 = time.perf_counter()
    container = None
    try:
        try:
            container = client.containers.create(
                tag, command, name=box.random_name(), environment=environment, working_dir=str(folder),
                user=f"{uid}:{gid}", mounts=_mounts(job, env or {}, folder, audit), read_only=True, network_mode="none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit=memory, memswap_limit=memory,
                pids_limit=box.MAX_PROCESSES, ulimits=ulimits, labels={LABEL: f"{socket.gethostname()}:{os.getpid()}"},
                log_config=docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
                device_requests=gpus)
            container.start()
        except docker.errors.DockerException as exc:
            raise KernelbotError(f"docker runner: could not start the job container: {str(exc).splitlines()[0]}") \
                from exc
        timed_out, code = _wait(container, timeout)
        seconds = time.perf_counter() - t0
        container.reload()
        oom = bool(container.attrs["State"].get("OOMKilled"))
        (workdir / box.STDERR).write_bytes(container.logs(stdout=True, stderr=True))
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
        stop.set()
        reader.join()
        os.close(audit_fd)
        audit.unlink(missing_ok=True)
        box.close_box(folder, workdir)
    if gpu is not None and (timed_out or code != 0):  # the container is gone, and every process of it
        protections.append(check_health(gpu, set(), ecc_before))
    ending = box.Ending(timed_out, code, seconds, bytes(records), " (out of memory)" if oom else "")
    return box.outcome(workdir, timeout, ending, protections)


def _environment(job: dict[str, Any], folder: Path, env: dict[str, str] | None,
                 gpu: int | None) -> tuple[dict[str, str], str | None]:
    """The container's environment (the box's, the caller's, no secrets, nothing of Docker's) and the GPU it
    gets, if any: `gpu`, else for a CUDA job the one the process runner's child would see."""
    inherited = box.child_env({**box.box_env(folder), **(env or {})})
    environment = {k: v for k, v in inherited.items() if not k.startswith("DOCKER_")}
    device = None if gpu is None else visible_gpu(gpu)  # the container runtime names GPUs as the node does
    if device is None and job.get("device") == "cuda":
        device = (environment.get("CUDA_VISIBLE_DEVICES", "") or "0").split(",")[0]
    if device is not None:  # inside, the container's one GPU is index 0
        environment.pop("CUDA_VISIBLE_DEVICES", None)
    return environment, device


def _protections(tag: str, timeout: float, memory: int, uid: int, device: str | None, limited: bool) -> list[str]:
    protections = [f"docker runner ({tag})", f"timeout {timeout:.0f} s (container killed)", "secrets scrubbed from env",
                   "no network (--network none)", "read-only root filesystem; host runtime mounted read-only",
                   "writable: the job's box only", f"memory {memory >> 30} GiB, no swap (cgroup)",
                   f"address space {memory >> 30} GiB" if limited else "no address-space limit (CUDA or ASan)",
                   f"≤ {box.MAX_PROCESSES} processes (--pids-limit)",
                   f"files ≤ {box.MAX_FILE_BYTES >> 30} GiB", "no core dumps", "no capabilities (--cap-drop ALL)",
                   "no new privileges", f"user {uid}", "own pid namespace; container removed afterwards"]
    protections.append(f"GPU {device} only (--gpus device={device})" if device is not None else "no GPU")
    return protections


def _wait(container: Any, timeout: float) -> tuple[bool, int | None]:
    """(timed out, exit status) of the container; past `timeout` it is killed, and its status is None when even
    the kill does not end it within 10 minutes (it is removed by force all the same)."""
    import docker
    import requests

    try:
        return False, container.wait(timeout=timeout)["StatusCode"]
    except requests.exceptions.RequestException:
        pass
    try:  # SIGKILL to the container's pid 1: the kernel then kills everything in its pid namespace
        container.kill()
    except docker.errors.APIError:
        pass  # it ended meanwhile, or is still tearing down (hundreds of torch processes take seconds)
    try:
        return True, container.wait(timeout=600)["StatusCode"]
    except requests.exceptions.RequestException:
        return True, None
