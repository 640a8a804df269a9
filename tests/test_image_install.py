"""How `kernelbot image build` installs kernelbot into the base image: engine/image.py's install script, run here
against local stand-ins for a base's Python (no Docker needed): a system Python marked externally managed as PEP 668
specifies (this interpreter copied to a prefix of its own, with the EXTERNALLY-MANAGED marker in its stdlib), venvs,
and one without pip. The same script in a real image build is tested at the end (needs dockerd; skipped without)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pip
import pytest
from test_image import _run_dir

from kernelbot.engine import image

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
BASE_EXECUTABLE = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
PROBE = "kbprobe"  # the package of the test wheel


def _wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel holding one package, PROBE."""
    files = {f"{PROBE}/__init__.py": b"VALUE = 1\n",
             f"{PROBE}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n".encode(),
             f"{PROBE}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files[f"{PROBE}-1.0.dist-info/RECORD"] = "\n".join([*record, f"{PROBE}-1.0.dist-info/RECORD,,", ""]).encode()
    path = dest / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
    return path


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def _give(python: Path, *, pip_too: bool = True, engine: str | None = None) -> Path:
    """Put pip (this environment's, linked) and an importable stand-in engine package into `python`'s site-packages."""
    site = _site_packages(python)
    site.mkdir(parents=True, exist_ok=True)
    if pip_too:
        (site / "pip").symlink_to(Path(pip.__file__).parent)
    if engine:
        (site / engine).mkdir()
        (site / engine / "__init__.py").write_text("")
    return python


def _system_python(root: Path, marked: bool) -> Path:
    """A system Python of its own (sys.prefix == sys.base_prefix == root): this interpreter's binary copied to
    root/bin, its standard library linked entry by entry into root/lib/pythonX.Y, an empty site-packages, and, when
    `marked`, PEP 668's EXTERNALLY-MANAGED marker in that stdlib directory."""
    stdlib = Path(sysconfig.get_path("stdlib"))
    if stdlib != Path(sys.base_prefix) / "lib" / VERSION:
        pytest.skip(f"this Python's standard library ({stdlib}) is not at <prefix>/lib/{VERSION}: cannot copy it")
    lib = root / "lib" / VERSION
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages", "EXTERNALLY-MANAGED"):
            (lib / entry.name).symlink_to(entry)
    if marked:
        (lib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=this Python belongs to the system\n")
    (root / "bin").mkdir()
    python = root / "bin" / "python3"
    shutil.copy2(BASE_EXECUTABLE, python)
    prefix = subprocess.run([str(python), "-c", "import sys; print(sys.prefix, sys.base_prefix)"],
                            capture_output=True, text=True)
    if prefix.stdout.split() != [str(root)] * 2:
        pytest.skip(f"a copy of {BASE_EXECUTABLE} does not take its own prefix: {prefix.stderr.strip()[-200:]}")
    return python


def _venv(root: Path, base: Path = BASE_EXECUTABLE) -> Path:
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    return root / "bin" / "python3"


def _install(tmp_path: Path, path: list[Path], **env: str) -> subprocess.CompletedProcess:
    """Run the generated install script on the test wheel, with `path` (folders holding pythons) as PATH."""
    script = tmp_path / "install.sh"
    script.write_text(image.INSTALL_SCRIPT)
    environment = {"PATH": os.pathsep.join(str(p) for p in path), "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
                   "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env}
    return subprocess.run(["/bin/sh", str(script), str(_wheel(tmp_path))], capture_output=True, text=True,
                          env=environment, timeout=120)


def _imports_probe(python: Path) -> bool:
    return subprocess.run([str(python), "-c", f"import {PROBE}"], capture_output=True).returncode == 0


def test_an_externally_managed_system_python_is_installed_into_with_break_system_packages(tmp_path):
    python = _give(_system_python(tmp_path / "system", marked=True), engine="sglang")
    refused = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", str(_wheel(tmp_path))],
                             capture_output=True, text=True, env={"PIP_NO_INDEX": "1", "HOME": str(tmp_path)})
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr  # as on Debian 12
    done = _install(tmp_path, [python.parent])
    assert done.returncode == 0, done.stderr
    assert f"{python} (externally-managed): pip install --no-deps --no-cache-dir --break-system-packages" in done.stdout
    assert _imports_probe(python)


def test_a_venv_over_a_marked_python_is_installed_into_without_overriding_pep_668(tmp_path):
    system = _system_python(tmp_path / "system", marked=True)
    python = _give(_venv(tmp_path / "venv", base=system), engine="sglang")
    done = _install(tmp_path, [python.parent, system.parent])
    assert done.returncode == 0, done.stderr
    assert f"{python} (venv): pip install --no-deps --no-cache-dir " in done.stdout
    assert "--break-system-packages" not in done.stdout
    assert _imports_probe(python) and not _imports_probe(system)


def test_the_python_that_imports_the_engine_is_chosen_over_one_earlier_on_path(tmp_path):
    earlier = _give(_venv(tmp_path / "earlier"))
    engine = _give(_venv(tmp_path / "engine"), engine="sglang")
    done = _install(tmp_path, [earlier.parent, engine.parent])
    assert done.returncode == 0, done.stderr
    assert f"kernelbot: {engine} (venv)" in done.stdout
    assert _imports_probe(engine) and not _imports_probe(earlier)


def test_the_python_build_arg_overrides_the_search(tmp_path):
    named = _give(_venv(tmp_path / "named"))
    engine = _give(_venv(tmp_path / "engine"), engine="sglang")
    done = _install(tmp_path, [engine.parent], **{image.PYTHON_ARG: str(named)})
    assert done.returncode == 0, done.stderr
    assert _imports_probe(named) and not _imports_probe(engine)


def test_without_a_python_that_imports_the_engine_the_first_one_found_is_used_and_said(tmp_path):
    first = _give(_venv(tmp_path / "first"))
    second = _give(_venv(tmp_path / "second"))
    done = _install(tmp_path, [first.parent, second.parent], KERNELBOT_ENGINE_MODULE="kb_no_such_engine")
    assert done.returncode == 0, done.stderr
    assert f"no Python here imports kb_no_such_engine; installing into {first}" in done.stdout
    assert _imports_probe(first) and not _imports_probe(second)


def test_a_python_without_pip_fails_with_one_line_naming_the_fix(tmp_path):
    python = _give(_system_python(tmp_path / "system", marked=True), pip_too=False, engine="sglang")
    done = _install(tmp_path, [python.parent])
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0
    assert f"kernelbot: {python} (externally-managed) has no pip" in done.stderr and "--no-install" in done.stderr


def test_a_named_python_that_does_not_run_fails_with_one_line(tmp_path):
    done = _install(tmp_path, [Path("/nonexistent")], **{image.PYTHON_ARG: "/nonexistent/python3"})
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0
    assert f"{image.PYTHON_ARG}=/nonexistent/python3 is not a Python 3.8+" in done.stderr


def test_build_puts_the_script_in_the_context_and_passes_the_python_build_arg(tmp_path, monkeypatch):
    def fake_wheel(dest: Path) -> str:
        (dest / "kernelbot-0-py3-none-any.whl").write_bytes(b"wheel")
        return "kernelbot-0-py3-none-any.whl"

    seen = {}

    def fake_build(path: str, **kwargs):
        seen.update(kwargs, script=(Path(path) / "install.sh").read_text(),
                    dockerfile=(Path(path) / "Dockerfile").read_text())
        return SimpleNamespace(id="sha256:1", labels={}), []

    monkeypatch.setattr(image, "build_wheel", fake_wheel)
    client = SimpleNamespace(images=SimpleNamespace(build=fake_build))
    image.build(_run_dir(tmp_path), "debian:12", "x:1", client=client, python="/opt/engine/bin/python")
    assert seen["script"] == image.INSTALL_SCRIPT
    assert seen["buildargs"] == {image.PYTHON_ARG: "/opt/engine/bin/python"}
    assert "RUN sh /opt/kernelbot/install.sh /opt/kernelbot/kernelbot-0-py3-none-any.whl" in seen["dockerfile"]
    image.build(_run_dir(tmp_path / "again"), "debian:12", "x:1", client=client)
    assert seen["buildargs"] is None


# ---- with a real Docker engine and registry (tests/conftest.py: skipped, saying why, without dockerd) ----

@pytest.mark.slow
def test_the_plugin_registers_in_a_base_whose_python_is_externally_managed(docker_env, tmp_path):
    """The base is this machine's Python (tests/docker_helpers.python_rootfs) plus PEP 668's marker in its stdlib:
    a plain `python3 -m pip install` fails there as on Debian 12; the image's install succeeds."""
    from docker_helpers import python_rootfs

    client, registry, _ = docker_env
    rootfs = io.BytesIO(python_rootfs())
    stdlib = subprocess.run(["python3", "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with tarfile.open(fileobj=rootfs, mode="a") as tar:
        marker = b"[externally-managed]\nError=this Python belongs to the system\n"
        info = tarfile.TarInfo(f"{stdlib.lstrip('/')}/EXTERNALLY-MANAGED")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    client.api.import_image_from_data(rootfs.getvalue(), repository="kb-python-pep668", tag="1")
    plain_pip = ["sh", "-c", "python3 -m pip install --no-deps x.whl 2>&1; true"]
    plain = client.containers.run("kb-python-pep668:1", plain_pip, network_mode="none", remove=True).decode()
    assert "externally-managed-environment" in plain
    run = _run_dir(tmp_path)
    tag = f"{registry}/kernelbot/pep668:run1"
    image.build(run, "kb-python-pep668:1", tag, install=True, client=client)
    probe = "import importlib.metadata as m; print([e.value for e in m.entry_points(group='sglang.srt.plugins')])"
    out = client.containers.run(tag, ["python3", "-c", probe], network_mode="none", remove=True).decode()
    assert "['kernelbot.engine.sglang_plugin:register']" in out
