"""The rooms import downwards only. From the bottom: the shared base (kernelbot/'s records, paths, loading, packages),
hardware/ (device, host load, peaks), sandbox/, kernel_library/, engine/, profiler/, agent/, and the command line
(kernelbot/cli*.py) on top. Inside agent/, its wings follow the stage order (WINGS: the journal every stage keeps,
then tasks → propose → llm → verify → measure → report), each importing only wings before it, and never the loop's
own modules (agent/*.py) that use them. Every import counts, those inside functions too: a
room that reaches upwards, even lazily, is a cycle waiting."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("base", "hardware", "sandbox", "kernel_library", "engine", "profiler", "agent", "front")
FRONT = ("cli", "cli_runs")  # kernelbot/<name>.py: the command line
WINGS = ("journal", "tasks", "propose", "llm", "verify", "measure", "report")  # agent/'s wings, in stage order


def room_of_file(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    if parts[0] == "kernelbot":
        return "front" if Path(parts[-1]).stem in FRONT else "base"
    return parts[0]


def room_of_module(name: str) -> str | None:
    """The room a `kernelbot.…` module lives in; None for anything outside kernelbot."""
    parts = name.split(".")
    if parts[0] != "kernelbot":
        return None
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "front" if len(parts) > 1 and parts[1] in FRONT else "base"


def loop_module(name: str, wings: set[str]) -> bool:
    """Whether `name` is one of agent/'s own modules (the loop's), not a wing's."""
    parts = name.split(".")
    return parts[:2] == ["kernelbot", "agent"] and len(parts) > 2 and parts[2] not in wings


def _later_wing(wing: str, name: str) -> bool:
    """Whether `name` is in a wing of agent/ that comes after `wing` in the stage order (a wing not in WINGS counts
    as last, so a new wing must be placed)."""
    parts = name.split(".")
    if parts[:2] != ["kernelbot", "agent"] or len(parts) < 4 or parts[2] == wing:
        return False
    order = {w: i for i, w in enumerate(WINGS)}
    return order.get(parts[2], len(WINGS)) > order.get(wing, len(WINGS))


def upward_imports(root: Path) -> list[str]:
    """'file -> module (room -> higher room)' for every import that points up the layers, and 'file -> module
    (wing -> loop)' for a wing of agent/ importing the loop's modules."""
    wings = {p.parent.name for p in (root / "agent").glob("*/__init__.py")}
    found = []
    for folder in ("kernelbot", *LAYERS[1:-1]):
        for path in sorted((root / folder).rglob("*.py")):
            source = room_of_file(path, root)
            in_wing = source == "agent" and len(path.relative_to(root).parts) > 2
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    target = room_of_module(name)
                    if target is not None and LAYERS.index(target) > LAYERS.index(source):
                        found.append(f"{path.relative_to(root)} -> {name} ({source} -> {target})")
                    elif in_wing and loop_module(name, wings):
                        found.append(f"{path.relative_to(root)} -> {name} (wing -> loop)")
                    elif in_wing and _later_wing(path.relative_to(root).parts[1], name):
                        found.append(f"{path.relative_to(root)} -> {name} (wing -> later wing)")
    return found


def test_no_room_imports_a_room_above_it() -> None:
    assert upward_imports(ROOT) == []


def test_an_import_pointing_up_is_found_even_inside_a_function(tmp_path: Path) -> None:
    for folder in ("kernelbot", *LAYERS[1:-1]):
        (tmp_path / folder).mkdir()
    (tmp_path / "engine" / "runner.py").write_text("def run():\n    from kernelbot.agent.optimize import optimize\n")
    (tmp_path / "kernelbot" / "records.py").write_text("from kernelbot.profiler.host import HostLoad\n")
    (tmp_path / "kernelbot" / "cli.py").write_text("from kernelbot.agent import optimize\n")  # the top may
    (tmp_path / "agent" / "report").mkdir()
    (tmp_path / "agent" / "report" / "__init__.py").write_text("")
    (tmp_path / "agent" / "report" / "status.py").write_text("from kernelbot.agent.cluster import Progress\n")
    for wing in ("journal", "llm"):
        (tmp_path / "agent" / wing).mkdir()
        (tmp_path / "agent" / wing / "__init__.py").write_text("")
    (tmp_path / "agent" / "journal" / "replay.py").write_text("from kernelbot.agent.llm.client import Answer\n")
    (tmp_path / "agent" / "run.py").write_text("from kernelbot.agent.report.status import show\n")  # the loop may
    assert upward_imports(tmp_path) == [
        "kernelbot/records.py -> kernelbot.profiler.host (base -> profiler)",
        "engine/runner.py -> kernelbot.agent.optimize (engine -> agent)",
        "agent/journal/replay.py -> kernelbot.agent.llm.client (wing -> later wing)",
        "agent/report/status.py -> kernelbot.agent.cluster (wing -> loop)"]
