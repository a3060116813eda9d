"""Shell completion: committed scripts match the app, bash completes for real, the fast path stays light."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.cli.completion import FILES, SHELLS, commands, script

ROOT = Path(__file__).resolve().parent.parent
REGEN = "python tools/gen_completions.py"
SPEC_VALUES = ["auto", "off", "draft-simple", "draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark",
               "ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache"]  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS)
def test_committed_scripts_match_the_app(shell: str) -> None:
    committed = (ROOT / "completions" / FILES[shell]).read_text()
    assert committed == script(shell, app), f"completions/{FILES[shell]} is out of date: run `{REGEN}`"


@pytest.mark.parametrize("shell", SHELLS)
def test_the_completion_command_prints_the_script(shell: str) -> None:
    r = CliRunner().invoke(app, ["completion", shell])
    assert r.exit_code == 0 and r.stdout == script(shell, app)


def test_bash_script_is_valid_bash() -> None:
    r = subprocess.run(["bash", "-n", str(ROOT / "completions" / FILES["bash"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "alpha.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "models").mkdir()
    hub = Path(os.environ["HF_HUB_CACHE"])
    for repo in ("acme--tiny-GGUF", "Qwen--Qwen3-8B-GGUF"):
        (hub / f"models--{repo}" / "snapshots").mkdir(parents=True)
    (hub / "datasets--acme--data" / "snapshots").mkdir(parents=True)  # not a model: never offered
    return tmp_path


def bash_complete(line: str, cwd: Path) -> list[str]:
    """Complete ``line`` (the cursor at its end) the way bash does on Tab, with the committed script."""
    words = line.split(" ")
    prog = (
        f"source {ROOT / 'completions' / FILES['bash']}\n"
        f"COMP_WORDS=({' '.join(repr(w) if w else repr('') for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_llamafit\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "-c", prog], cwd=cwd, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completes_commands_options_and_values(workdir: Path) -> None:
    names = [c.name for c in commands(app)]
    assert bash_complete("llamafit ", workdir) == [*names, "--help", "--version"]
    assert bash_complete("llamafit pl", workdir) == ["plan"]
    assert "--spec" in bash_complete("llamafit plan --sp", workdir)
    assert bash_complete("llamafit plan --spec ", workdir) == SPEC_VALUES
    assert bash_complete("llamafit run --spec draft-d", workdir) == ["draft-dflash", "draft-dspark"]
    assert bash_complete("llamafit run --prefer ", workdir) == ["balanced", "context", "speed"]
    assert bash_complete("llamafit completion ", workdir) == ["bash", "zsh", "fish"]
    assert bash_complete("llamafit plan --gpu ", workdir) == []  # a size: nothing to guess


def test_bash_completes_models_as_gguf_files_dirs_and_cached_repos(workdir: Path) -> None:
    got = bash_complete("llamafit plan ", workdir)
    assert "alpha.gguf" in got and "models" in got and "notes.txt" not in got
    assert "acme/tiny-GGUF" in got and "Qwen/Qwen3-8B-GGUF" in got and "acme/data" not in got
    assert bash_complete("llamafit run Qw", workdir) == ["Qwen/Qwen3-8B-GGUF"]
    assert "alpha.gguf" in bash_complete("llamafit plan x.gguf --draft ", workdir)


def test_after_the_separator_only_files_are_offered(workdir: Path) -> None:
    got = bash_complete("llamafit run alpha.gguf -- --", workdir)
    assert not any(w.startswith("--") for w in got)  # llama-server flags are not llamafit's
    assert "notes.txt" in bash_complete("llamafit run alpha.gguf -- ", workdir)


def _options_by_command(text: str, shell: str) -> None:
    for c in commands(app):
        for o in c.options:
            for n in o.names:
                flag = n if shell == "zsh" else (f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}")
                assert flag in text, f"{shell}: {c.name} {n} missing"


def test_zsh_offers_every_option_and_the_values() -> None:
    text = script("zsh", app)
    _options_by_command(text, "zsh")
    spec_lines = [line for line in text.splitlines() if "--spec'" in line]
    assert spec_lines and all(f"({' '.join(SPEC_VALUES)})" in line for line in spec_lines)
    assert "'1:model:_llamafit_models'" in text and "_files -g '*.gguf'" in text
    assert "'*'--gpu" in text  # repeatable
    for c in commands(app):
        assert re.search(rf"^\s+'{c.name}:", text, re.M), c.name


def test_fish_offers_every_option_and_the_values() -> None:
    text = script("fish", app)
    _options_by_command(text, "fish")
    assert f"-l spec -x -a '{' '.join(SPEC_VALUES)}'" in text
    assert "-l prefer -x -a 'balanced context speed'" in text
    assert "-n '__fish_seen_subcommand_from plan' -a '(__llamafit_models)'" in text
    assert "__fish_complete_suffix .gguf" in text


def test_the_completion_fast_path_stays_light(workdir: Path) -> None:
    code = (
        "import sys, io, contextlib\n"
        "from llamafit.cli.entry import complete\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    complete('repos')\n"
        "heavy = [m for m in ('typer', 'rich', 'pynvml', 'huggingface_hub', 'psutil', 'gguf') if m in sys.modules]\n"
        "print(heavy)\n"
        "print(buf.getvalue().split())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    heavy, repos = r.stdout.splitlines()
    assert heavy == "[]", heavy
    assert repos == "['Qwen/Qwen3-8B-GGUF', 'acme/tiny-GGUF']"


def test_the_wheel_installs_the_scripts(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("llamafit_cli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for installed in ("share/bash-completion/completions/llamafit", "share/zsh/site-functions/_llamafit",
                      "share/fish/vendor_completions.d/llamafit.fish"):  # fmt: skip
        assert any(n.endswith(".data/data/" + installed) for n in names), (installed, names)
    shutil.rmtree(tmp_path)
