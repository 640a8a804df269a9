"""The command line and the option records agree: every optimize flag's default is its field's default, and a value
a record's constraints refuse is one line naming the flag and what it takes, before any run directory exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.cli import build_parser, main
from kernelbot.engine.serving.serve_options import ServeOptions
from kernelbot.flags import flag_of


def _defaults() -> dict:
    return vars(build_parser().parse_args(["optimize"]))


@pytest.mark.parametrize("record, fields", [
    (OptimizeOptions, ["model", "dtype", "batch", "prompt_len", "decode_steps", "seed", "min_share", "max_tasks",
                       "timeout", "e2e_rounds", "iterations", "device"]),
    (ServeOptions, ["tp", "port", "requests_per_round"]),
    (LLMOptions, ["samples", "repair_rounds"]),
])
def test_each_flags_default_is_its_fields_default(record: type, fields: list[str]) -> None:
    parsed = _defaults()
    for field in fields:
        dest = flag_of(record, field).removeprefix("--").replace("-", "_")
        assert parsed[dest] == record.model_fields[field].default, field


@pytest.mark.parametrize("argv, line", [
    (["--batch", "0"], "--batch must be at least 1, got 0"),
    (["--min-share", "1.5"], "--min-share must be below 1.0, got 1.5"),
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--timeout", "0"], "--timeout must be positive, got 0.0"),
    (["--peak-gbps", "-3"], "--peak-gbps must be positive, got -3.0"),
    (["--max-task-minutes", "0"], "--max-task-minutes must be positive, got 0.0"),
    (["--engine", "vllm", "--port", "70000"], "--port must be at most 65535, got 70000"),
    (["--llm", "openai/x", "--llm-retries", "-1"], "--llm-retries must be 0 or more, got -1"),
    (["--llm", "openai/x", "--max-llm-seconds", "0"], "--max-llm-seconds must be positive, got 0.0"),
])
def test_a_refused_value_is_one_line_naming_its_flag(argv: list[str], line: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "--run-dir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
