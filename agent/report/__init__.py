"""What a run leaves for people: report.json/md (report.py), report.html (report_html.py) with its figures (plots.py),
the PR (pr.py), `kernelbot status` (status.py)."""
