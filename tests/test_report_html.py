"""report.html: self-contained (no external resources), every section present, and it renders in headless Chromium
with its figures drawn."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from finished_run import fake_run

from kernelbot.agent.report.markdown import write_report

SECTIONS = ["end-to-end", "figures", "accepted", "roofline", "spend", "rejected"]


def _report(tmp_path):
    run_dir = tmp_path / "run"
    report = fake_run(run_dir)
    write_report(report, run_dir)
    return run_dir


def test_html_is_self_contained_and_complete(tmp_path):
    run_dir = _report(tmp_path)
    html = (run_dir / "report.html").read_text()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html), "an external resource"
    for section in SECTIONS:
        assert f"id='{section}'" in html, section
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) == 4
    for needle in ("30.0 → 20.5 ms", "failed race: program 1", "$0.0028", "budget_hours 8.0", "of roofline"):
        assert needle in html, needle
    md = (run_dir / "report.md").read_text()
    assert "## Rejected candidates (2)" in md and "![roofline](plots/roofline.png)" in md
    assert "## Spend and budgets" in md and (run_dir / "plots" / "breakdown.png").stat().st_size > 1000


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")


def test_html_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    run_dir = _report(tmp_path)
    url = (run_dir / "report.html").resolve().as_uri()
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path}"
            "/profile"]
    dom = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "Rejected candidates (2)" in dom and dom.count("<img") == 4 and "Roofline position" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*args, f"--screenshot={shot}", "--window-size=1200,2600", url], capture_output=True, timeout=120)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    saturation = pixels.max(axis=-1) - pixels.min(axis=-1)
    # the figures' bars (blue, green, orange) are the only strongly coloured things on the page: a page whose
    # images failed to decode would have almost none
    assert (saturation > 0.35).mean() > 0.01, f"figures not drawn ({(saturation > 0.35).mean():.4f} coloured)"
    assert pixels.shape[0] >= 2600 and (pixels < 0.2).all(axis=-1).mean() > 0.002  # text was drawn
