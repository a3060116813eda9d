"""Every citation of the shipped references resolves: ``docs/NAME.md §N`` names a file and a section in it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from llamafit.gguf.model import ModelInfo

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"docs/([a-z-]+\.md) §(\d+(?:\.\d+)*)")
# an old-style citation that names no file
BARE = re.compile(r"\breference (?:\S+\.md )?\(?§\d")
HEADING = re.compile(r"^#+ (\d+(?:\.\d+)*)\.? ", re.MULTILINE)


def sources() -> list[Path]:
    files = [p for d in ("llamafit", "tests", "tools", "bench") for p in (ROOT / d).rglob("*.py")]
    return [*files, ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").glob("*.md")]


def sections(doc: Path) -> set[str]:
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def test_every_cited_section_exists() -> None:
    cited = 0
    bad = []
    for src in sources():
        text = src.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            cited += 1
            doc = ROOT / "docs" / m.group(1)
            if not doc.is_file() or m.group(2) not in sections(doc):
                bad.append(f"{src.relative_to(ROOT)}: {m.group(0)}")
    assert cited > 20, "the code cites the references: the pattern must find them"
    assert not bad, "citations of sections that do not exist:\n" + "\n".join(bad)


def test_no_citation_without_a_file() -> None:
    bare = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sources() if p.suffix == ".py"
            for m in BARE.finditer(p.read_text(encoding="utf-8"))]  # fmt: skip
    assert not bare, "cite docs/NAME.md §N:\n" + "\n".join(bare)


def test_a_missing_section_is_caught(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "memory-model.md"
    assert "5.5" in sections(doc) and "5.55" not in sections(doc) and "99" not in sections(doc)


def test_the_exit_code_table_has_every_code_and_its_json() -> None:
    """The usage page's table names every exit code llamafit uses, each with what --json prints on stdout."""
    from llamafit.errors import ExitCode

    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    table = text[text.index("## Exit codes") : text.index("## Environment")]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \|(.*)\|$", table, re.M)}
    assert set(rows) == {int(c) for c in ExitCode}
    assert all(row.count("|") >= 1 and row.rsplit("|", 1)[1].strip() for row in rows.values())


def test_the_plan_schema_names_every_key_plan_json_prints(l8b: ModelInfo) -> None:
    """docs/json.md's ``llamafit.plan/1`` block names every top-level key ``plan --json`` prints, and every key of
    its ``speed`` and of a ``tradeoffs`` row: a key added to the contract is added to its reference."""
    from typer.testing import CliRunner

    from llamafit.cli.app import app

    text = (ROOT / "docs" / "json.md").read_text(encoding="utf-8")
    block = text[text.index('"schema": "llamafit.plan/1"') :]
    block = block[: block.index("```")]
    r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "8GiB@rtx-4060", "--host-ram", "32GiB", "--json"])
    doc = json.loads(r.stdout)
    assert doc["tradeoffs"], "a card too small for the whole model gives trade-off rows"
    keys = {*doc, *doc["speed"], *doc["tradeoffs"][0]}
    missing = sorted(k for k in keys if f'"{k}"' not in block)
    assert not missing, f"docs/json.md does not name: {missing}"
