"""Ship a run's kernel pack as a container image on top of the engine's image, push it, keep an index
of promoted images. Built and pushed through the Docker SDK (`pip install 'kernelbot[docker]'`).

kernelbot's wheel goes into the Python the engine runs from, found in the base image by INSTALL_SCRIPT (a POSIX
shell script, so that it runs in any base and can be tried here against local interpreters): the build arg
KERNELBOT_PYTHON when given, else the first Python that can import the engine (sglang). pip is asked to override
PEP 668's "externally managed" refusal only for a system Python that carries the marker; a venv or conda
environment is installed into as it is."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError, __version__
from kernelbot.engine.router import PACK_ENV
from kernelbot.engine.serving.apis import PLUGIN_NAME
from kernelbot.records import Fidelity, Pack

PACK_PATH = "/opt/kernelbot/pack"
LABEL = "org.kernelbot."
DEFAULT_INDEX = Path.home() / ".kernelbot" / "promotions.jsonl"
INSTALL_DIR = "/opt/kernelbot"
PYTHON_ARG = "KERNELBOT_PYTHON"  # build arg: the interpreter to install into, when the search should not decide
# Usage: install.sh WHEEL, with $KERNELBOT_PYTHON from the build arg; $KERNELBOT_ENGINE_MODULE (default sglang) names
# the module the engine's interpreter imports. Exits non-zero with a line saying what to do when it cannot install.
INSTALL_SCRIPT = r"""#!/bin/sh
# Installs kernelbot's wheel into the Python the engine runs from (written by kernelbot.engine.image).
set -eu
wheel="$1"
engine="${KERNELBOT_ENGINE_MODULE:-sglang}"
nl='
'

candidates() {  # python3 and python in PATH order, then the usual places
    IFS=:
    for dir in $PATH; do
        for name in python3 python; do [ -z "$dir" ] || echo "$dir/$name"; done
    done
    for path in /opt/conda/bin/python3 /opt/venv/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
        echo "$path"
    done
}

runs() { [ -x "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 8))' >/dev/null 2>&1; }

imports_engine() {
    "$1" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)' "$engine" \
        >/dev/null 2>&1
}

if [ -n "${KERNELBOT_PYTHON:-}" ]; then
    python="$KERNELBOT_PYTHON"
    runs "$python" || { echo "kernelbot: KERNELBOT_PYTHON=$python is not a Python 3.8+ in this image:" \
        "pass the engine's interpreter (e.g. --build-arg KERNELBOT_PYTHON=/usr/bin/python3)" >&2; exit 1; }
else
    python=""
    first=""
    IFS=$nl
    for candidate in $(candidates); do
        runs "$candidate" || continue
        [ -n "$first" ] || first="$candidate"
        if imports_engine "$candidate"; then python="$candidate"; break; fi
    done
    unset IFS
    if [ -z "$python" ]; then
        [ -n "$first" ] || { echo "kernelbot: no Python 3.8+ in this image: use a base with the engine's Python," \
            "or build with --no-install" >&2; exit 1; }
        echo "kernelbot: no Python here imports $engine; installing into $first"
        python="$first"
    fi
fi

# PEP 668: pip refuses a system Python whose stdlib holds EXTERNALLY-MANAGED (Debian 12, Ubuntu 24.04), not a venv
kind=$("$python" -c '
import os, sys, sysconfig
venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix) or hasattr(sys, "real_prefix")
marked = os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
conda = os.path.isdir(os.path.join(sys.prefix, "conda-meta"))
print("venv" if venv else "externally-managed" if marked else "conda" if conda else "system")
')
if ! "$python" -m pip --version >/dev/null 2>&1; then
    [ "$kind" = externally-managed ] || "$python" -m ensurepip --default-pip >/dev/null 2>&1 || true
    "$python" -m pip --version >/dev/null 2>&1 || { echo "kernelbot: $python ($kind) has no pip: add pip to the" \
        "base image (Debian/Ubuntu: apt-get install python3-pip) or build with --no-install" >&2; exit 1; }
fi
set -- --no-deps --no-cache-dir
if [ "$kind" = externally-managed ]; then
    set -- "$@" --break-system-packages  # the engine lives in this system Python: that is where the plugin must go
fi
echo "kernelbot: $python ($kind): pip install $* $wheel"
exec "$python" -m pip install "$@" "$wheel"
"""


@dataclass
class RunInfo:
    run_dir: Path
    pack: Pack
    digest: str  # sha256 over the manifest and every kernel file
    model: str
    verification: str
    problems: list[str]  # why the run may not be promoted; empty when it may
    engine: str = "sglang"  # the engine whose Python the pack installs into: the run's served engine, else SGLang


def pack_digest(pack_dir: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in pack_dir.rglob("*") if p.is_file()):
        h.update(path.relative_to(pack_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def read_run(run_dir: Path) -> RunInfo:
    manifest = run_dir / "pack" / "manifest.json"
    if not manifest.is_file():
        raise KernelbotError(f"{run_dir}: no pack/manifest.json (not a kernelbot run directory, or it made no pack)")
    try:
        pack = Pack.model_validate_json(manifest.read_text())
    except ValueError as exc:
        raise KernelbotError(f"{manifest}: not a kernelbot pack manifest ({str(exc).splitlines()[0]})") from exc
    model = "unknown"
    if (run_dir / "model.json").is_file():
        model = json.loads((run_dir / "model.json").read_text()).get("name", "unknown")
    problems = [f"kernel {e.candidate_id} is not verified ({e.verification.split(':')[0]})"
                for e in pack.entries if not e.verification.startswith("pass")]
    for e in pack.entries:
        if not (run_dir / "pack" / e.source_file).is_file():
            problems.append(f"kernel {e.candidate_id}: {e.source_file} is missing from the pack")
    fidelity = "fidelity not checked"
    engine = "sglang"
    report = run_dir / "report.json"
    if report.is_file():
        data = json.loads(report.read_text())
        fid = data.get("fidelity") or {}
        fidelity = (f"greedy_match={fid.get('greedy_match')} max_abs_logit_diff={fid.get('max_abs_logit_diff')} "
                    f"token_agreement={fid.get('token_agreement')} within_dtype_noise={fid.get('within_noise')}")
        if not fid or not Fidelity.model_validate(fid).passed:
            problems.append(f"fidelity check failed: {fidelity} repetition_collapse={fid.get('repetition_collapse')}")
        engine = "vllm" if data.get("engine") == "vllm" else engine
        serving = data.get("serving") or {}
        if serving.get("engaged") is False:  # a served run whose engine never ran the pack proves nothing
            problems.append("the pack did not run in every process of the served model (see report.md, Serving)")
    else:
        problems.append("no report.json: fidelity was never checked")
    if not pack.entries:
        problems.append("the pack has no kernels")
    verified = sum(e.verification.startswith("pass") for e in pack.entries)
    summary = f"{verified}/{len(pack.entries)} kernels verified; {fidelity}"
    return RunInfo(run_dir, pack, pack_digest(run_dir / "pack"), model, summary, problems, engine)


def labels(info: RunInfo) -> dict[str, str]:
    return {f"{LABEL}version": __version__, f"{LABEL}run-id": info.pack.run_id,
            f"{LABEL}pack-digest": info.digest, f"{LABEL}pack-version": info.pack.version,
            f"{LABEL}model": info.model, f"{LABEL}verification": info.verification}


def dockerfile(base: str, info: RunInfo, wheel: str | None, install: bool) -> str:
    """The image's Dockerfile; with `install`, the build context must hold install.sh (INSTALL_SCRIPT)."""
    lines = [f"FROM {base}"]
    lines += [f"LABEL {k}={json.dumps(v)}" for k, v in labels(info).items()]
    lines.append(f"COPY pack/ {PACK_PATH}/")
    if wheel:
        lines.append(f"COPY {wheel} {INSTALL_DIR}/{wheel}")
        if install:
            # no deps: the engine image brings torch and the rest; the plugin needs only those and pydantic
            lines.append(f"COPY install.sh {INSTALL_DIR}/install.sh")
            lines.append(f"ARG {PYTHON_ARG}=")
            lines.append(f"ENV KERNELBOT_ENGINE_MODULE={info.engine}")
            lines.append(f"RUN sh {INSTALL_DIR}/install.sh {INSTALL_DIR}/{wheel}")
    # the activation: vLLM and SGLang load the kernelbot plugin in every process; it reads the pack from here
    lines.append(f"ENV SGLANG_PLUGINS={PLUGIN_NAME} VLLM_PLUGINS={PLUGIN_NAME} {PACK_ENV}={PACK_PATH}")
    return "\n".join(lines) + "\n"


def _client():
    try:
        import docker
    except ImportError as exc:
        raise KernelbotError("image commands need the Docker SDK: pip install 'kernelbot[docker]'") from exc
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises several types for an absent or refusing daemon
        raise KernelbotError(f"no Docker engine reachable (DOCKER_HOST or /var/run/docker.sock): {exc}") from exc
    return client


def build_wheel(dest: Path) -> str:
    """kernelbot's own wheel, for the image (from this source checkout)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise KernelbotError("building an image needs kernelbot's source checkout (pyproject.toml not found)")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(dest), str(root)], capture_output=True, text=True)
    wheels = sorted(dest.glob("kernelbot-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise KernelbotError(f"building kernelbot's wheel failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wheels[-1].name


def build(run_dir: Path, base: str, tag: str, install: bool = True, client: Any = None,
          python: str | None = None) -> dict[str, Any]:
    """Build TAG from BASE with the run's pack, kernelbot and its activation; returns id, tag and labels.
    `python`: the base's interpreter to install kernelbot into (default: the one that imports the engine)."""
    info = read_run(run_dir)
    client = client or _client()
    with tempfile.TemporaryDirectory(prefix="kernelbot-image-") as tmp:
        ctx = Path(tmp)
        shutil.copytree(run_dir / "pack", ctx / "pack")
        wheel = build_wheel(ctx)
        (ctx / "Dockerfile").write_text(dockerfile(base, info, wheel, install))
        (ctx / "install.sh").write_text(INSTALL_SCRIPT)
        try:
            image, _ = client.images.build(path=str(ctx), tag=tag, rm=True, pull=False,
                                           buildargs={PYTHON_ARG: python} if python else None)
        except Exception as exc:
            text = "".join(str(chunk.get("stream", "")) for chunk in getattr(exc, "build_log", None) or [])
            log = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if line.strip()]
            last = f" (last output: {log[-1].strip()})" if log else ""
            raise KernelbotError(f"docker build of {tag} failed: {str(exc).splitlines()[0]}{last}") from exc
    return {"tag": tag, "id": image.id, "labels": image.labels, "run_id": info.pack.run_id,
            "pack_digest": info.digest}


def push(tag: str, client: Any = None) -> str:
    """Push TAG to its registry; returns the manifest digest the registry reported."""
    client = client or _client()
    repo, _, version = tag.rpartition(":")
    if not repo or "/" in version:
        repo, version = tag, "latest"
    digest = None
    for line in client.images.push(repo, tag=version, stream=True, decode=True):
        if "error" in line:
            raise KernelbotError(f"push of {tag} failed: {line['error']}")
        digest = (line.get("aux") or {}).get("Digest", digest)
    if not digest:
        raise KernelbotError(f"push of {tag} reported no digest")
    return digest


def promote(run_dir: Path, base: str, tag: str, index: Path = DEFAULT_INDEX, install: bool = True,
            client: Any = None, python: str | None = None) -> dict[str, Any]:
    """Build and push only a run whose every kernel is verified and whose fidelity check passed, then
    append (tag, digest, run, date) to the promotions index."""
    info = read_run(run_dir)
    if info.problems:
        raise KernelbotError(f"{run_dir} cannot be promoted: {'; '.join(info.problems)}")
    client = client or _client()
    built = build(run_dir, base, tag, install=install, client=client, python=python)
    digest = push(tag, client=client)
    record = {"tag": tag, "digest": digest, "run_id": info.pack.run_id, "run_dir": str(run_dir.resolve()),
              "model": info.model, "pack_digest": info.digest, "image_id": built["id"],
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    index.parent.mkdir(parents=True, exist_ok=True)
    with open(index, "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def list_promotions(index: Path = DEFAULT_INDEX) -> list[dict[str, Any]]:
    if not index.is_file():
        return []
    rows = []
    for n, line in enumerate(index.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise KernelbotError(f"{index}:{n}: not a promotions record") from exc
    return rows
