"""The ``file:line`` citations into llama.cpp, held to the tree they cite.

Every ``name.cpp:L`` or ``name.cpp:L-M`` (also ``, L-M`` ranges after it, and ``.c .h .cu .cuh .comp .m``)
in llamafit's code, tests, benches and docs is resolved in the llama.cpp tree: a path from the tree's
root, else the files whose path ends with it (``loader.cpp`` is ``src/llama-model-loader.cpp``). The
lock file records, per cited range, a fingerprint of the lines it covers; after a version bump the test
(tests/test_citations.py) lists each citation whose lines changed, which is what to read again.

    python tools/gen_citations.py $LLAMA_CPP_SRC -o tests/golden/citations.txt
"""

from __future__ import annotations

import argparse
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".cpp", ".c", ".h", ".cu", ".cuh", ".comp", ".m", ".mm")
SCANNED = ("llamafit", "tests", "bench", "docs", "tools", "README.md")
_NAME = r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.(?:cpp|c|h|cu|cuh|comp|m|mm))"
CITE = re.compile(_NAME + r":(\d+(?:-\d+)?(?:, ?\d+(?:-\d+)?)*)(?![\d.])")


@dataclass(frozen=True)
class Citation:
    where: str  # repo file:line that cites
    name: str  # the cited file as written
    ranges: tuple[tuple[int, int], ...]


def find(root: Path = ROOT) -> list[Citation]:
    out: list[Citation] = []
    for top in SCANNED:
        base = root / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.suffix in (".py", ".md"))
        for p in paths:
            if "golden" in p.parts or p.name in ("gen_citations.py", "test_citations.py"):  # examples, not citations
                continue
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for m in CITE.finditer(line):
                    ranges = []
                    for part in m.group(2).split(","):
                        a, _, b = part.strip().partition("-")
                        ranges.append((int(a), int(b or a)))
                    out.append(Citation(f"{p.relative_to(root)}:{n}", m.group(1), tuple(ranges)))
    return out


def resolve(tree: Path, name: str, index: list[str]) -> list[str]:
    """The tree files a cited name means: the path itself, else every file whose path ends with it."""
    if (tree / name).is_file():
        return [name]
    tail = name.lstrip("-")
    return sorted(p for p in index if p.endswith("/" + tail) or p.rsplit("/", 1)[-1].endswith(tail))


def tree_index(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def check(tree: Path, cites: list[Citation]) -> tuple[list[str], dict[str, str]]:
    """Problems (a file not in the tree, a range past its end) and the fingerprint of each cited range."""
    index = tree_index(tree)
    lines: dict[str, list[str]] = {}
    problems: list[str] = []
    prints: dict[str, str] = {}
    for c in cites:
        files = resolve(tree, c.name, index)
        if not files:
            problems.append(f"{c.where}: {c.name} is not in the llama.cpp tree")
            continue
        for a, b in c.ranges:
            key = f"{c.name}:{a}-{b}"
            digest = []
            for f in files:
                text = lines.setdefault(f, (tree / f).read_text(encoding="utf-8", errors="replace").splitlines())
                if b >= a and b <= len(text):
                    body = "\n".join(x.strip() for x in text[a - 1 : b])
                    digest.append(f"{f}={hashlib.sha1(body.encode()).hexdigest()[:12]}")
            if not digest:
                problems.append(f"{c.where}: {key} is not within {' or '.join(files)}")
            prints[key] = " ".join(digest)
    return problems, prints


def generate(tree: Path, root: Path = ROOT) -> str:
    _, prints = check(tree, find(root))
    return "".join(f"{k} {v}\n" for k, v in sorted(prints.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "tests" / "golden" / "citations.txt")
    a = ap.parse_args()
    a.out.write_text(generate(a.tree), encoding="utf-8")


if __name__ == "__main__":
    main()
