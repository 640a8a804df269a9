"""compute-sanitizer's text report → error count and the first error, for the verifier's GPU checks."""

from __future__ import annotations

import re

_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_ERROR = re.compile(r"=+ ((?:Invalid|Race|Uninitialized|Barrier|Misaligned|Out-of-range|Program hit|"
                    r"Leaked|Malloc|Error)[^\n]*)")


def parse_summary(text: str) -> tuple[int | None, str]:
    """(number of errors, or None when there is no summary; the first error line)."""
    counts = _SUMMARY.findall(text)
    if not counts:
        return None, ""
    first = _ERROR.search(text)
    return int(counts[-1]), first.group(1).strip() if first else ""
