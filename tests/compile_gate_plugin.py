"""pytest -p compile_gate_plugin (TRITON_INTERPRET=1, KERNELBOT_GPU_TARGET set): every Triton launch the tests make is
compiled for that target too (triton_check's compile gate), and the builds are written to KERNELBOT_BUILDS_OUT as
JSON when the session ends (tests/test_compile_gate.py)."""

from __future__ import annotations

import json
import os

from kernelbot.agent.verify import triton_check


def pytest_configure(config: object) -> None:
    triton_check.install()


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    with open(os.environ["KERNELBOT_BUILDS_OUT"], "w") as out:
        json.dump(triton_check.REPORT.builds, out)
