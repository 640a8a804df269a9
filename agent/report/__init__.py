"""What a run leaves for people: report.json/md (markdown.py), report.html (html.py) with its figures (plots.py),
the PR (pr.py), `kernelbot status` (status.py)."""
