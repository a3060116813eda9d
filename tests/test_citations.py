"""The ``file:line`` citations into llama.cpp hold: each cited file is in the tree the server is built from,
each range lies within it, and the lines each range covers are the ones they were when the code citing
them was written (``tests/golden/citations.txt``). CI names the tree in ``LLAMA_CPP_SRC``."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from tests.realserver import llama_cpp_tree as tree

ROOT = Path(__file__).resolve().parent.parent
GEN: dict[str, Any] = runpy.run_path(str(ROOT / "tools" / "gen_citations.py"))
LOCK = ROOT / "tests" / "golden" / "citations.txt"


def test_every_citation_names_lines_of_the_tree() -> None:
    cites = GEN["find"](ROOT)
    assert len(cites) > 200
    problems, _ = GEN["check"](tree(), cites)
    assert not problems, "\n".join(problems)


def test_the_cited_lines_are_the_ones_read() -> None:
    """After a llama.cpp bump, the citations whose lines changed: read them again, fix what moved, then
    regenerate the lock."""
    fresh = dict(line.split(" ", 1) for line in GEN["generate"](tree(), ROOT).splitlines())
    locked = dict(line.split(" ", 1) for line in LOCK.read_text(encoding="utf-8").splitlines())
    moved = sorted(k for k in fresh.keys() & locked.keys() if fresh[k] != locked[k])
    new = sorted(fresh.keys() - locked.keys())
    assert not moved and not new, (
        f"changed lines: {moved[:40]}; not in the lock: {new[:40]}; when each is read again: "
        "python tools/gen_citations.py $LLAMA_CPP_SRC -o tests/golden/citations.txt"
    )


def test_a_citation_past_the_end_is_caught(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "llama-model-loader.cpp").write_text("a\nb\nc\n")
    cites = [GEN["Citation"]("x.py:1", "loader.cpp", ((2, 3),)), GEN["Citation"]("x.py:2", "loader.cpp", ((3, 9),)),
             GEN["Citation"]("x.py:3", "gone.cpp", ((1, 1),))]  # fmt: skip
    problems, prints = GEN["check"](tmp_path, cites)
    assert problems == ["x.py:2: loader.cpp:3-9 is not within src/llama-model-loader.cpp",
                        "x.py:3: gone.cpp is not in the llama.cpp tree"]  # fmt: skip
    assert prints["loader.cpp:2-3"].startswith("src/llama-model-loader.cpp=")
