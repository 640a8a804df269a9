"""kernelbot as a wheel, and the install recipe around it.

The wheel is built from a copy of this tree as `kernelbot image build` builds it (`pip wheel --no-deps
--no-build-isolation`), installed NON-editable into a new venv, and used there: every module in it imports, the
console script answers, the SGLang plugin's entry point is declared and its `register()` runs.

How the new venv gets the third-party dependencies, fast and offline: it is made without pip, this interpreter's pip
installs the wheel into it with `--no-deps --no-index` (`pip --python`), and a .pth file in it names a folder of
symlinks to this test venv's site-packages entries less kernelbot's own (its editable finder, its .pth files, its
dist-info). A folder named in a .pth joins sys.path without the .pth files inside it being run, and the view leaves
out kernelbot's metadata, so `kernelbot`, its modules and its entry points resolve only to the installed wheel.
(`--system-site-packages` would not do: it shares the base interpreter's site-packages, not this venv's, and a .pth
naming this venv's site-packages itself would still show the editable install's metadata.)

The recipe: kernelbot's requirements pin no torch or triton release (a GPU node has its own, SGLang pins its own);
constraints/cpu.txt pins exactly the ones the README's commands install, and .ci/run runs ruff, then the README's
test command as written.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from kernelbot.records import Pack, PackEntry

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
KERNEL_SOURCES = ("*.cpp", "*.h", "*.cu", "*.cuh")
BUILD_LEFTOVERS = ("__pycache__", "*.pyc", "*.so", "build", "*.egg-info")
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN = "kernelbot_pack"
PLUGIN_TARGET = "kernelbot.engine.sglang_plugin:register"
RMSNORM_LAYER = "sglang.srt.layers.layernorm.RMSNorm"
TORCH_STACK = ("torch", "triton")  # what a GPU node or SGLang brings, and the CPU set-up pins
CPU_CONSTRAINTS = "constraints/cpu.txt"


# ---- the wheel, installed into a new venv ----

@dataclass
class Installed:
    src: Path  # the copy of the checkout the wheel was built from
    wheel: Path
    python: Path  # the new venv's interpreter
    purelib: Path  # its site-packages, where the wheel went
    workdir: Path  # cwd for its commands: not the checkout, whose kernelbot/ folder would shadow the wheel
    env: dict[str, str]


def _package_dir() -> dict[str, str]:
    return PYPROJECT["tool"]["setuptools"]["package-dir"]


def _copy_source(dest: Path) -> Path:
    """The files a build reads: the checkout's top-level files and the package folders, without build leftovers."""
    dest.mkdir()
    for path in ROOT.iterdir():
        if path.is_file():
            shutil.copy2(path, dest / path.name)
    for folder in set(_package_dir().values()):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    return dest


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)


def _build_wheel(src: Path, out: Path) -> Path:
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                 str(src)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = out.glob("kernelbot-*.whl")
    return wheel


def _dependency_view(dest: Path) -> Path:
    """Symlinks to this interpreter's site-packages entries, less kernelbot's own, the .pth files and sglang (the
    plugin test tries register() without it first, whatever this venv holds)."""
    dest.mkdir()
    for site in dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")):
        for entry in Path(site).iterdir():
            name = entry.name.lower()
            if ("kernelbot" in name or name.startswith("sglang") or name.endswith(".pth")
                    or (dest / entry.name).exists()):
                continue
            (dest / entry.name).symlink_to(entry)
    return dest


def _clean_env(bin_dir: Path) -> dict[str, str]:
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SGLANG_PLUGINS", "KERNELBOT_PACK_DIR", "KERNELBOT_COUNTS_DIR"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_source(tmp / "src")
    wheel = _build_wheel(src, tmp / "dist")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)]).check_returncode()
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                   .stdout.strip())
    proc = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                 str(wheel)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (purelib / "_kernelbot_test_dependencies.pth").write_text(f"{_dependency_view(tmp / 'deps')}\n")
    (tmp / "work").mkdir()
    return Installed(src, wheel, python, purelib, tmp / "work", _clean_env(venv / "bin"))


def _python(inst: Installed, script: str, *args: str) -> subprocess.CompletedProcess:
    return _run([str(inst.python), "-c", script, *args], cwd=inst.workdir, env=inst.env)


def _last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _module_names(wheel: Path) -> list[str]:
    modules = [name.removesuffix(".py").replace("/", ".") for name in _wheel_names(wheel)
               if name.startswith("kernelbot/") and name.endswith(".py")]
    return sorted(m.removesuffix(".__init__") for m in modules)


def test_the_wheel_holds_every_module_and_kernel_source_of_the_package_folders(installed: Installed) -> None:
    expected = set()
    for package, folder in _package_dir().items():
        root = installed.src / folder
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and (
                    path.suffix == ".py" or any(path.match(p) for p in KERNEL_SOURCES)):
                expected.add(f"{package.replace('.', '/')}/{path.relative_to(root).as_posix()}")
    assert any(name.endswith(".cpp") for name in expected) and any(name.endswith(".h") for name in expected)
    missing = sorted(expected - set(_wheel_names(installed.wheel)))
    assert not missing, f"not in the wheel: {missing}"


def test_every_module_of_the_installed_wheel_imports_from_the_new_venv(installed: Installed) -> None:
    script = (
        "import importlib, json, sys\n"
        "failed, files = {}, {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        files[name] = importlib.import_module(name).__file__\n"
        "    except Exception as exc:\n"
        "        failed[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps({'failed': failed, 'files': files}))\n")
    modules = _module_names(installed.wheel)
    assert {"kernelbot", "kernelbot.kernel_library", "kernelbot.cli"} <= set(modules)
    result = _last_json(_python(installed, script, *modules))
    # the one module that runs only inside vLLM's processes subclasses vLLM's attention backend at import
    assert result["failed"] == {"kernelbot.engine.vllm_attention": "ModuleNotFoundError: No module named 'vllm'"}
    outside = {m: f for m, f in result["files"].items() if not Path(f).is_relative_to(installed.purelib)}
    assert not outside, f"imported from outside the installed wheel: {outside}"


def test_the_installed_console_script_answers_help(installed: Installed) -> None:
    kernelbot = str(installed.python.parent / "kernelbot")
    top = _run([kernelbot, "--help"], cwd=installed.workdir, env=installed.env)
    assert top.returncode == 0 and top.stdout.startswith("usage: kernelbot"), top.stderr[-2000:]
    assert "verify" in top.stdout and "optimize" in top.stdout
    verify = _run([kernelbot, "verify", "--help"], cwd=installed.workdir, env=installed.env)
    assert verify.returncode == 0 and verify.stdout.startswith("usage: kernelbot verify"), verify.stderr[-2000:]
    assert "reference" in verify.stdout and "candidate" in verify.stdout


def test_the_wheel_declares_the_sglang_plugin_and_the_venv_finds_it_there(installed: Installed) -> None:
    [entry_points] = [n for n in _wheel_names(installed.wheel) if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(installed.wheel) as zf:
        declared = configparser.ConfigParser()
        declared.read_string(zf.read(entry_points).decode())
    assert declared[PLUGIN_GROUP][PLUGIN] == PLUGIN_TARGET
    assert declared["console_scripts"]["kernelbot"] == "kernelbot.cli:main"
    script = (
        "import json\n"
        "from importlib.metadata import entry_points\n"
        f"found = [e for e in entry_points(group={PLUGIN_GROUP!r}) if e.name == {PLUGIN!r}]\n"
        "print(json.dumps([[e.value, str(e.dist.locate_file(''))] for e in found]))\n")
    [[value, site]] = json.loads(_python(installed, script).stdout.strip().splitlines()[-1])
    assert value == PLUGIN_TARGET and Path(site) == installed.purelib


STUB_HOOK_REGISTRY = '''"""Stands in for SGLang's hook registry: records each registration."""
import enum

REGISTERED = []


class HookType(enum.Enum):
    AROUND = "around"


class HookRegistry:
    @staticmethod
    def register(target, hook, hook_type):
        REGISTERED.append([target, hook_type.name])
'''

# register() as SGLang calls it, three times: without sglang; with a stand-in hook registry but no pack named;
# with a pack named (an rmsnorm kernel SGLang's RMSNorm takes and a gated_mlp one no SGLang layer takes)
PLUGIN_SCRIPT = '''
import json, os, sys
from importlib.metadata import entry_points
[ep] = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kernelbot_pack"]
register = ep.load()
out = {"module": sys.modules[register.__module__].__file__}
try:
    register()
    out["without_sglang"] = "returned"
except ImportError as exc:
    out["without_sglang"] = exc.name
stub_dir, pack_dir, counts_dir = sys.argv[1:4]
sys.path.insert(0, stub_dir)
from sglang.srt.plugins.hook_registry import REGISTERED
out["no_pack_returned"] = repr(register())
out["no_pack_hooks"] = list(REGISTERED)
os.environ.update(KERNELBOT_PACK_DIR=pack_dir, KERNELBOT_COUNTS_DIR=counts_dir)
register()
out["pack_hooks"] = list(REGISTERED)
print(json.dumps(out))
'''


def _stub_sglang(root: Path) -> Path:
    plugins = root / "sglang" / "srt" / "plugins"
    plugins.mkdir(parents=True)
    for package in (root / "sglang", root / "sglang" / "srt", plugins):
        (package / "__init__.py").write_text("")
    (plugins / "hook_registry.py").write_text(STUB_HOOK_REGISTRY)
    return root


def _pack(pack_dir: Path) -> Path:
    def entry(family: str, module_class: str, shapes: list[list[int]]) -> PackEntry:
        return PackEntry(task_id=f"t_{family}", candidate_id=f"t_{family}__cpp", family=family,
                         module_class=module_class, input_shapes=shapes, init_args=[512], dtype="float32",
                         backend="cpp", config={}, source_file=f"kernels/t_{family}__cpp.py", source_hash="0",
                         verification="pass", speedup=1.2)

    pack = Pack(version="0.1.0", run_id="wheel-test", device="cpu",
                entries=[entry("rmsnorm", "RMSNorm", [[8, 32, 512]]),
                         entry("gated_mlp", "LlamaMLP", [[8, 32, 512]])])
    pack_dir.mkdir()
    (pack_dir / "manifest.json").write_text(pack.model_dump_json())
    return pack_dir


PluginRun = tuple[dict, str, Path]


@pytest.fixture(scope="module")
def plugin_run(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> PluginRun:
    """(what the script saw, its stderr, the counts folder) from register() in the new venv."""
    tmp = tmp_path_factory.mktemp("plugin")
    counts = tmp / "counts"
    proc = _python(installed, PLUGIN_SCRIPT, str(_stub_sglang(tmp / "stub")), str(_pack(tmp / "pack")), str(counts))
    return _last_json(proc), proc.stderr, counts


def test_the_plugin_register_without_sglang_fails_only_for_want_of_sglang(
        installed: Installed, plugin_run: PluginRun) -> None:
    seen, _, _ = plugin_run
    assert Path(seen["module"]).is_relative_to(installed.purelib)
    assert seen["without_sglang"] == "sglang"  # SGLang calls register() only where it is installed


def test_the_plugin_register_without_a_pack_named_hooks_nothing_and_says_so(plugin_run: PluginRun) -> None:
    seen, stderr, _ = plugin_run
    assert seen["no_pack_returned"] == "None" and seen["no_pack_hooks"] == []
    assert "neither KERNELBOT_PACK_DIR nor KERNELBOT_CAPTURE_DIR is set; nothing to do" in stderr


def test_the_plugin_register_with_a_pack_hooks_the_layers_its_kernels_cover(plugin_run: PluginRun) -> None:
    seen, _, counts = plugin_run
    assert seen["pack_hooks"] == [[f"{RMSNORM_LAYER}.forward", "AROUND"]]
    [written] = [json.loads(p.read_text()) for p in counts.glob("counts-pid*.json")]
    assert written["run_id"] == "wheel-test" and written["hooked"] == [RMSNORM_LAYER]
    assert [u["family"] for u in written["unrouted"]] == ["gated_mlp"]


# ---- the install recipe ----

def _requirements(extras: set[str], seen: set[str] | None = None) -> list[Requirement]:
    """kernelbot's requirements with these extras, kernelbot[...] self-references followed."""
    project = PYPROJECT["project"]
    seen = set() if seen is None else seen
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in sorted(extras - seen):
        seen.add(extra)
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    own = [r for r in reqs if r.name == project["name"]]
    for r in own:
        reqs += _requirements(set(r.extras), seen)
    return [r for r in reqs if r.name != project["name"]]


@dataclass
class PipInstall:
    constraints: list[str]
    extras: set[str]


def _readme_commands() -> dict[str, str]:
    """The set-up section's command lines, by what they end with: 'optimize' (the main job) and 'test'."""
    section = (ROOT / "README.md").read_text().split("## Set-up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("python3 -m venv")]
    commands = {"optimize": [c for c in lines if c.endswith("kernelbot optimize")],
                "test": [c for c in lines if c.endswith("python -m pytest")]}
    assert all(len(found) == 1 for found in commands.values()), lines
    return {what: found[0] for what, found in commands.items()}


def _pip_install(command: str) -> PipInstall:
    [step] = [s for s in command.split(" && ") if s.startswith("pip install ")]
    args = shlex.split(step)[2:]
    constraints = [args[i + 1] for i, a in enumerate(args) if a == "-c"]
    [spec] = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    match = re.fullmatch(r"\.(?:\[([\w,-]*)\])?", spec)
    assert match, f"not an install of this checkout: {spec}"
    return PipInstall(constraints, set(filter(None, (match.group(1) or "").split(","))))


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            [spec] = req.specifier
            assert spec.operator == "==", f"{path}: {line} is not an exact pin"
            pins[req.name] = spec.version
    return pins


def test_kernelbot_requirements_pin_no_torch_or_triton_release() -> None:
    every_extra = set(PYPROJECT["project"]["optional-dependencies"])
    stack = [r for r in _requirements(every_extra) if r.name in TORCH_STACK]
    assert {r.name for r in stack} == set(TORCH_STACK)
    assert all(spec.operator == ">=" for r in stack for spec in r.specifier), [str(r) for r in stack]
    assert "torch" in {r.name for r in _requirements(set())}
    assert "sglang" in {r.name for r in _requirements({"sglang"})}  # with SGLang's own torch pin, not ours


def test_the_cpu_constraints_pin_exactly_the_torch_stack_the_readme_commands_install() -> None:
    installs = {what: _pip_install(command) for what, command in _readme_commands().items()}
    assert all(i.constraints == [CPU_CONSTRAINTS] for i in installs.values()), installs
    installed_names = {r.name for i in installs.values() for r in _requirements(i.extras)}
    pins = _pins(ROOT / CPU_CONSTRAINTS)
    assert set(pins) == {name for name in TORCH_STACK if name in installed_names}
    assert set(pins) <= installed_names  # no pin for something neither command installs


# each extra's distributions, by the module kernelbot imports them as
IMPORTED_AS = {"nvidia-ml-py": "pynvml", "litellm": "litellm", "triton": "triton", "sglang": "sglang",
               "docker": "docker", "matplotlib": "matplotlib", "ray": "ray"}
PACKAGE_FOLDERS = tuple(PYPROJECT["tool"]["setuptools"]["package-dir"].values())


def test_every_package_an_extra_installs_is_one_kernelbots_code_imports() -> None:
    """An extra that pins what nothing imports (the gpu extra's cupy-cuda12x once was) costs every install that asks
    for it a download and a CUDA-version constraint for nothing."""
    sources = "\n".join(p.read_text() for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py"))
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, requirements in extras.items():
        if extra == "test":
            continue
        for req in map(Requirement, requirements):
            module = IMPORTED_AS.get(req.name)
            assert module is not None, f"[{extra}] {req.name}: which module is it imported as? (IMPORTED_AS)"
            assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), f"[{extra}] {req.name}: not imported"


def test_the_main_command_installs_what_the_report_draws_its_figures_with() -> None:
    main = _pip_install(_readme_commands()["optimize"])
    assert "matplotlib" in {r.name for r in _requirements(main.extras)}


def test_ci_runs_ruff_then_the_readme_test_command_exactly() -> None:
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    test_command = _readme_commands()["test"]
    assert ci_lines[-1] == test_command
    steps = test_command.split(" && ")
    assert steps.index("ruff check .") < steps.index("python -m pytest")
