"""Names with control characters and bidi overrides: stdout data round-trips exactly through a shell,
and nothing raw reaches a terminal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.shellwords import join, quote
from tests import factory

NASTY = [
    "n2/\x1b[31mxy.gguf",  # an ESC: a colour sequence
    "title\x1b]0;pwned\x07.gguf",  # an OSC title sequence
    "line\nbreak.gguf",
    "bidi\u202egnp.gguf",  # RIGHT-TO-LEFT OVERRIDE
    "csi\u009b31m.gguf",  # a C1 control
    "quote's and back\\slash.gguf",
    "plain-name.gguf",
]


@pytest.mark.parametrize("word", NASTY)
def test_a_word_round_trips_through_bash(word: str) -> None:
    r = subprocess.run(["bash", "-c", f"printf %s {quote(word)}"], capture_output=True)
    assert r.stdout == word.encode("utf-8")


def test_invalid_utf8_bytes_round_trip() -> None:
    raw = b"bad\xff\xfe.gguf".decode("utf-8", "surrogateescape")
    r = subprocess.run(["bash", "-c", f"printf %s {quote(raw)}"], capture_output=True)
    assert r.stdout == b"bad\xff\xfe.gguf"


@pytest.mark.parametrize("name", NASTY[:5])
def test_dry_run_prints_an_argv_that_gives_back_the_file(tmp_path: Path, name: str) -> None:
    sub = tmp_path / name.split("/")[0] if "/" in name else tmp_path
    sub.mkdir(exist_ok=True)
    path = factory.dense().write(sub / name.split("/")[-1])
    r = CliRunner().invoke(app, ["run", str(path), "--gpu", "8GiB", "--dry-run"])
    assert r.exit_code == 0, r.output
    line = r.stdout.strip()
    assert "\x1b" not in line and "\u202e" not in line and "\x9b" not in line and "\n" not in line
    # the shell gives back the exact path llama-server would open
    got = subprocess.run(["bash", "-c", f'set -- {line}; printf %s "$3"'], capture_output=True)
    assert got.stdout == str(path).encode("utf-8")


def test_the_human_plan_view_never_shows_a_raw_control(tmp_path: Path) -> None:
    shape = factory.dense(name="evil\x1b]0;x\x07\u202eeman")
    path = shape.write(tmp_path / "m\x1b[2J.gguf")
    r = CliRunner().invoke(app, ["plan", str(path), "--gpu", "8GiB"])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in r.stdout and raw not in r.stderr
    assert "\\x1b" in r.stdout and "\\u202e" in r.stdout


def test_join_is_shlex_join_for_ordinary_words() -> None:
    import shlex

    argv = ["llama-server", "-m", "/models/a b.gguf", "-c", "4096", "--host", "0.0.0.0"]
    assert join(argv) == shlex.join(argv)
