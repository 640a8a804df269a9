"""kernelbot's package folders are listed once, from the installed package: the confined runner may read each of them
and the Docker runner mounts each of them, and a part added to the package is found without naming it anywhere."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbot.packages import package_folders
from kernelbot.sandbox.confine import readable_paths

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_PY = ROOT / "kernelbot" / "packages.py"


def _imported_from(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    return Path(spec.submodule_search_locations[0]).resolve()


def test_the_folders_are_those_the_packaging_maps_each_part_to():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert sorted(package_folders()) == sorted(_imported_from(name) for name in mapping)


def test_a_confined_runner_may_read_every_package_folder():
    readable = {p.resolve() for p in readable_paths([])}
    assert [f for f in package_folders() if f not in readable] == []


def test_the_docker_runner_mounts_every_package_folder_read_only_and_not_the_checkout_around_them(tmp_path):
    pytest.importorskip("docker")
    from kernelbot.sandbox.docker_runner import _mounts

    box = tmp_path / "box"
    box.mkdir()
    mounts = _mounts({}, {}, box, tmp_path / "audit.fifo")
    read_only = {Path(m["Source"]) for m in mounts if m["ReadOnly"]}
    assert [m["Source"] for m in mounts if not m["ReadOnly"] and m["Target"] != "/.kernelbot/audit"] == [str(box)]
    assert [f for f in package_folders() if not {f, *f.parents} & read_only] == []
    around = package_folders()[0].parent  # the checkout, in an editable install
    if str(around) not in sys.path and Path(sys.prefix).resolve() not in (around, *around.parents):
        assert around not in read_only


def test_a_part_added_to_an_installed_package_is_found_without_naming_it(tmp_path):
    """A wheel's layout: every part inside kernelbot/, another distribution's package beside it."""
    site = tmp_path / "site"
    for package in ("kernelbot", "kernelbot/agent", "kernelbot/a_new_part", "kernelbot/a_new_part/inner",
                    "not_kernelbot"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    (site / "kernelbot" / "packages.py").write_text(PACKAGES_PY.read_text())
    code = "import json; from kernelbot.packages import package_folders; print(json.dumps([str(p) for p in " \
           "package_folders()]))"
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    found = [Path(p) for p in json.loads(done.stdout)]
    assert found == [(site / p).resolve() for p in ("kernelbot", "kernelbot/a_new_part", "kernelbot/agent")]
