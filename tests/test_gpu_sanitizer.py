"""compute-sanitizer on a GPU node, tried here without one: its jobs reach their front end over loopback ports of
their own (and nothing else of the network), the four tools share one budget, and a report that is missing or
covers nothing is a failure to run, never a pass and never the candidate's fault."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from kernelbot.agent.verify import sanitizer
from kernelbot.agent.verify.messages import SanitizeJob, SentCase, SentPlan
from kernelbot.sandbox import SandboxResult, run_job
from kernelbot.sandbox.box import STDERR, loopback_env, loopback_ports
from kernelbot.sandbox.landlock import abi_version
from kernelbot.sandbox.runner import namespaces_available


def test_racechecks_own_summary_counts_its_errors_and_no_summary_counts_as_none() -> None:
    assert sanitizer.parse_summary(RACECHECK_CLEAN) == (0, "")
    assert sanitizer.parse_summary(RACY) == (2, "Error: Race reported between Write access at k+0x10")
    assert sanitizer.parse_summary(CLEAN) == (0, "")
    assert sanitizer.parse_summary("========= COMPUTE-SANITIZER\n")[0] is None

CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
RACY = "========= COMPUTE-SANITIZER\n========= Error: Race reported between Write access at k+0x10\n" \
       "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
# racecheck's own summary, as an H200 node printed it (2026-12-04) for a kernel without races
RACECHECK_CLEAN = "========= COMPUTE-SANITIZER\n" \
                  "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
NOTHING = "========= COMPUTE-SANITIZER\n========= Error: Target application terminated before first instrumented " \
          "API call\n========= ERROR SUMMARY: 0 errors\n"


def _job(tmp_path: Path) -> SanitizeJob:
    return SanitizeJob(candidate=str(tmp_path / "candidate.py"), plan=str(tmp_path / "plan.pt"),
                       state_dicts=[str(tmp_path / "state.pt")], init_seed=1)


def _sanitize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports: dict[str, tuple[str, str]],
              budget: float = 60.0) -> tuple[dict[str, tuple[str, str]], list[dict]]:
    """sanitize() with each tool's job answered by `reports` (tool → (job status, what compute-sanitizer printed));
    returns {check id: (status, detail)} and what each job was started with."""
    started: list[dict] = []

    def fake_run_job(job: dict, workdir: Path, timeout: float, env: dict[str, str], gpu: int, wrapper: list[str]
                     ) -> SandboxResult:
        tool = wrapper[wrapper.index("--tool") + 1]
        started.append({"tool": tool, "timeout": timeout, "env": env, "wrapper": wrapper, "gpu": gpu})
        status, printed = reports[tool]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / STDERR).write_text(printed)
        return SandboxResult(status, 1.0, 0 if status == "ok" else 1, printed[-2000:] if status == "ok" else
                             "RuntimeError: the job's own error", None)

    monkeypatch.setattr(sanitizer, "run_job", fake_run_job)
    monkeypatch.setattr(sanitizer.shutil, "which", lambda name: f"/usr/bin/{name}")
    checks, _ = sanitizer.sanitize(_job(tmp_path), tmp_path, budget, {}, 1)
    return {c.id: (c.status, c.detail) for c in checks}, started


def test_a_clean_report_from_every_tool_passes_its_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reports = {t: ("ok", CLEAN) for t in sanitizer.SANITIZER_TOOLS} | {"racecheck": ("ok", RACECHECK_CLEAN)}
    checks, _ = _sanitize(tmp_path, monkeypatch, reports)
    assert {cid: status for cid, (status, _) in checks.items()} == {
        "out_of_bounds": "pass", "race": "pass", "unwritten_output": "pass"}
    assert "racecheck/synccheck: no errors" in checks["race"][1]


@pytest.mark.parametrize(("status", "printed", "why"), [
    ("ok", "", "no report"),
    ("error", CLEAN, "its summary covers a job that did not finish"),
    ("ok", NOTHING, "terminated before first instrumented API call"),
])
def test_a_missing_or_empty_report_is_a_failure_to_run_never_a_pass_nor_a_fail(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               status: str, printed: str,
                                                                               why: str) -> None:
    reports = {t: ("ok", CLEAN) for t in sanitizer.SANITIZER_TOOLS} | {"memcheck": (status, printed)}
    checks, _ = _sanitize(tmp_path, monkeypatch, reports)
    assert checks["out_of_bounds"][0] == "not_run"
    assert "compute-sanitizer memcheck did not run" in checks["out_of_bounds"][1] and why in checks["out_of_bounds"][1]
    assert checks["race"][0] == "pass"


def test_errors_fail_the_check_even_when_the_job_then_crashed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    reports = {t: ("ok", CLEAN) for t in sanitizer.SANITIZER_TOOLS} | {"racecheck": ("crash", RACY)}
    checks, _ = _sanitize(tmp_path, monkeypatch, reports)
    assert checks["race"][0] == "fail" and "racecheck: 2 error(s), first: Error: Race reported" in checks["race"][1]


def test_the_tools_share_one_budget_and_each_gets_loopback_ports_of_its_own(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, started = _sanitize(tmp_path, monkeypatch, {t: ("ok", CLEAN) for t in sanitizer.SANITIZER_TOOLS}, budget=40.0)
    assert sorted(s["tool"] for s in started) == sorted(sanitizer.SANITIZER_TOOLS)
    assert all(0 < s["timeout"] <= 40.0 and s["gpu"] == 1 for s in started)  # the verified job's GPU
    ports = [loopback_ports(s["env"]) for s in started]
    assert all(p is not None for p in ports)
    assert len({port for p in ports for port in p}) == sum(len(p) for p in ports)  # no port shared
    for s, p in zip(started, ports, strict=True):
        wrapper = s["wrapper"]
        assert int(wrapper[wrapper.index("--port") + 1]) == p.start
        assert int(wrapper[wrapper.index("--max-connections") + 1]) == len(p)


# The candidate of a sanitizer's job, after the harness confined it: what a native library in it (as
# compute-sanitizer's is) can do over TCP. Native calls, so the audit hook's Python-level refusal does not answer.
PROBE = textwrap.dedent("""
    import ctypes, json, socket, struct

    libc = ctypes.CDLL(None, use_errno=True)


    def address(port):
        return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton("127.0.0.1") + bytes(8)


    def errno_of(result):
        return 0 if result == 0 else ctypes.get_errno()


    def attempt(port):
        server, client = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0), libc.socket(socket.AF_INET,
                                                                                          socket.SOCK_STREAM, 0)
        bound = errno_of(libc.bind(server, address(port), 16))
        if bound == 0:
            libc.listen(server, 1)
        return {"bind": bound, "connect": errno_of(libc.connect(client, address(port), 16))}


    raise RuntimeError("PROBE " + json.dumps({"given": attempt(PORT), "other": attempt(PORT - 7)}))
""")


def _probe(tmp_path: Path, ports: range) -> tuple[dict, list[str]]:
    """What the job's candidate could do over TCP, given `ports`; and the protections the job ran under."""
    (tmp_path / "candidate.py").write_text(PROBE.replace("PORT", str(ports.start + 1)))
    torch.save(SentPlan(init_args=[[]], cases=[SentCase(label="main", model=0, inputs=[torch.ones(2)])]).model_dump(),
               tmp_path / "plan.pt")
    torch.save({}, tmp_path / "state.pt")
    result = run_job(_job(tmp_path).model_dump(mode="json"), tmp_path / "w", timeout=120, env=loopback_env(ports))
    assert "PROBE " in result.detail, result.detail[-2000:]
    return json.loads(result.detail.split("PROBE ", 1)[1].splitlines()[0]), result.protections


EACCES = 13  # Landlock refused it


@pytest.mark.skipif(abi_version() < 4, reason="this kernel's Landlock has no network rules")
def test_a_sanitizer_job_reaches_its_own_loopback_ports_and_no_other(tmp_path: Path) -> None:
    if not namespaces_available():
        pytest.skip("needs root and util-linux unshare for namespaces")
    ports = sanitizer.tool_ports(3)
    seen, protections = _probe(tmp_path, ports)
    assert seen["given"] == {"bind": 0, "connect": 0}
    assert seen["other"] == {"bind": EACCES, "connect": EACCES}
    assert any(f"except on ports {ports.start}-{ports.stop - 1}" in p for p in protections)
    assert "own network namespace with loopback only (for compute-sanitizer)" in protections


@pytest.mark.skipif(abi_version() < 4, reason="this kernel's Landlock has no network rules")
def test_without_a_network_namespace_a_sanitizer_job_gets_no_tcp_at_all(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELBOT_NO_NAMESPACES", "1")  # Landlock's port rules would reach any host, not loopback
    seen, protections = _probe(tmp_path, sanitizer.tool_ports(2))
    assert seen["given"] == seen["other"] == {"bind": EACCES, "connect": EACCES}
    assert any(p.startswith("no TCP at all: loopback ports need a network namespace") for p in protections)


def test_a_check_the_sanitizer_could_not_run_is_named_beside_the_judges_finding() -> None:
    from kernelbot.agent.verify.judge import merge
    from kernelbot.records import Check

    judged = Check(id="race", status="pass", detail="no address shared between programs")
    skipped = Check(id="race", status="not_run", detail="compute-sanitizer racecheck: no report")
    for merged in (merge(judged, skipped), merge(skipped, judged)):
        assert merged.status == "pass" and "racecheck: no report" in merged.detail
    assert merge(skipped, skipped).status == "not_run"


def test_the_compile_summary_names_the_architecture_the_kernels_were_built_for() -> None:
    from kernelbot.agent.verify.messages import PtxasKernel, PtxasReport
    from kernelbot.agent.verify.run import _ptxas_summary

    kernel = PtxasKernel(kernel="k", arch="sm_100", registers=32, smem_bytes=0, stack_bytes=0, spill_store_bytes=0,
                         spill_load_bytes=0)
    assert _ptxas_summary(PtxasReport(ok=True, kernels=[kernel])).startswith("nvcc -arch=sm_100 ")
