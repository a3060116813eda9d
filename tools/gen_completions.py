"""Regenerate completions/ from the app: ``python tools/gen_completions.py``.

The tests fail when the committed scripts drift from what the app generates.
"""

from __future__ import annotations

from pathlib import Path

from llamafit.cli.app import app
from llamafit.cli.completion import FILES, SHELLS, script

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    for shell in SHELLS:
        path = ROOT / "completions" / FILES[shell]
        path.write_text(script(shell, app))
        print(f"wrote {path.relative_to(ROOT)}")
