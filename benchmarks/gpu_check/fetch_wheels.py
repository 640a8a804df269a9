"""Fetch, where a package index is reachable, the wheels the GPU node lacks for kernelbot (its image has torch,
Triton, transformers, pandas and rich, but no pydantic, its parts, or pysimdjson), built for the node's Python, so
the check can install them there with no index (`gpu_check.sh --wheels DIR`). About 6 MB.

  python3 benchmarks/gpu_check/fetch_wheels.py DIR [--python-version 3.12] [--print]

The driver (driver.py) imports NODE_WHEELS and `missing` from here, to refuse in one line when DIR lacks any.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

# the versions the CPU set-up tests; typing-extensions: pydantic needs a newer one than the node's image may have
NODE_WHEELS = ("pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
               "pysimdjson==7.0.2", "typing-extensions==4.16.0")
# pip matches a manylinux tag exactly: name the ones these projects publish for x86-64
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
NODE_PYTHON = "3.12"


def _normal(name: str) -> str:
    """A project name as wheel files spell it (PEP 427: runs of -_. become _, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def command(folder: Path, python_version: str = NODE_PYTHON) -> list[str]:
    """pip download of NODE_WHEELS, binary only, for CPython `python_version` on x86-64 Linux, into `folder`."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            python_version, "--implementation", "cp", *platforms, "-d", str(folder), *NODE_WHEELS]


def missing(folder: Path, python_version: str) -> list[str]:
    """The NODE_WHEELS pins with no wheel in `folder` that the given CPython can install (pure-Python wheels, or
    ones built for its cpXY tag)."""
    tag = "cp" + python_version.replace(".", "")[:3]
    files = [w.name.lower() for w in folder.glob("*.whl")] if folder.is_dir() else []
    absent = []
    for pin in NODE_WHEELS:
        name, version = pin.split("==")
        prefix = f"{_normal(name)}-{version}-"
        if not any(f.startswith(prefix) and ("-py3-none-" in f or f"-{tag}-" in f or "-abi3-" in f) for f in files):
            absent.append(pin)
    return absent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where the wheels go (created)")
    parser.add_argument("--python-version", default=NODE_PYTHON, help=f"the node's Python (default {NODE_PYTHON})")
    parser.add_argument("--print", action="store_true", help="print the pip command instead of running it")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d{1,2}", args.python_version):
        parser.error(f"--python-version {args.python_version}: give MAJOR.MINOR, such as 3.12")
    cmd = command(args.folder, args.python_version)
    if args.print:
        print(shlex.join(cmd))
        return 0
    args.folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(cmd).returncode != 0:
        print(f"fetch_wheels: pip could not download them (is an index reachable?): {shlex.join(cmd)}",
              file=sys.stderr)
        return 1
    absent = missing(args.folder, args.python_version)
    if absent:
        print(f"fetch_wheels: {args.folder} still lacks {', '.join(absent)} for Python {args.python_version}",
              file=sys.stderr)
        return 1
    size = sum(w.stat().st_size for w in args.folder.glob("*.whl"))
    print(f"fetch_wheels: {len(NODE_WHEELS)} wheels for Python {args.python_version} in {args.folder} "
          f"({size / 1e6:.1f} MB); on the node: benchmarks/gpu_check.sh --wheels {args.folder} OUTDIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
