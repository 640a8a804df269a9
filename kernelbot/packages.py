"""kernelbot's package folders as this Python imports them, listed once: the sandbox lets a confined runner read them
(sandbox/confine.py) and the Docker runner mounts them (sandbox/docker_runner.py).

kernelbot installs as `kernelbot` plus one `kernelbot.<part>` per top-level folder of the checkout (pyproject.toml's
package-dir). A wheel puts every part inside kernelbot's own folder; an editable install leaves each part in its
checkout folder, beside kernelbot/. So the parts are the packages found in those two places that import as
`kernelbot.<name>` from exactly that folder: nothing here names them, and a new part needs no edit.
"""

from __future__ import annotations

import importlib.util
import pkgutil
from pathlib import Path

TOP = "kernelbot"


def package_folders() -> list[Path]:
    """The folder of `kernelbot` and of each `kernelbot.<part>`, resolved, in a fixed order."""
    top = _folder(TOP)
    if top is None:
        return []
    found = [top]
    for base in (top, top.parent):  # a wheel's parts, an editable checkout's
        found += [base / m.name for m in pkgutil.iter_modules([str(base)])
                  if m.ispkg and m.name.isidentifier() and _folder(f"{TOP}.{m.name}") == base / m.name]
    return list(dict.fromkeys(found))


def _folder(package: str) -> Path | None:
    """Where `package` imports from, or None when it is not a package here."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).resolve() if locations else None
