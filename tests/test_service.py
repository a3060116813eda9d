"""Start on boot: the unit llamafit writes for `run`, held to systemd's own checker where it is installed."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llamafit.errors import UsageError
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary
from llamafit.serving.service import Unit, install, render
from llamafit.serving.unit_syntax import quote, read_service

LLAMAFIT = [sys.executable, "-m", "llamafit"]
HAS_SYSTEMD = shutil.which("systemd-analyze") is not None


def service(args: list[str], home: Path, server: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"))
    if server:
        env["LLAMAFIT_SERVER"] = server
    return subprocess.run([*LLAMAFIT, "service", *args], capture_output=True, text=True, env=env, timeout=300)


def test_systemd_words() -> None:
    assert quote("plain/path.gguf") == "plain/path.gguf"
    assert quote("a b") == '"a b"'
    assert quote('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert quote("50%") == "50%%" and quote("$HOME") == "$$HOME"  # specifiers, variables
    assert quote("$HOME", variables=False) == "$HOME"  # Environment= does no $ processing
    assert quote("a\nb\rc\x1bd\x85") == '"a\\nb\\rc\\x1bd\\u0085"'  # never a raw line break or control


HOSTILE = [
    "x\nExecStartPre=/bin/touch pwned\nX-Note=y",
    "a\rb",
    "50%",
    "$HOME ${X}",
    "'q\"",
    "t\tab\\",
    "é\x85",
    ";",
    "",
]


def test_an_argument_cannot_add_a_line_to_the_unit() -> None:
    env = {"HOME": "/h", "PATH": "/bin", "LLAMAFIT_DATA": "/d/da$ta dir%\nX=1"}
    unit = render("x", ["m.gguf", "--", "--alias", *HOSTILE], env, "systemd")
    argv, kept = read_service(unit.text)
    assert (
        argv is not None
        and argv[-len(HOSTILE) :] == HOSTILE
        and kept == {"PATH": "/bin", "LLAMAFIT_DATA": env["LLAMAFIT_DATA"]}
    )
    keys = [line.partition("=")[0] for line in unit.text.splitlines() if "=" in line]
    assert "ExecStartPre" not in keys and "X-Note" not in keys and keys.count("ExecStart") == 1
    assert 'Environment="LLAMAFIT_DATA=/d/da$ta dir%%\\nX=1"' in unit.text  # $ as it is, % as a specifier's escape


@pytest.mark.skipif(not HAS_SYSTEMD, reason="systemd-analyze is not installed here")
def test_systemd_reads_each_word_as_it_was_meant(tmp_path: Path) -> None:
    """systemd names the executable it read in its complaint: each hostile word, written as the first word of
    ExecStart, comes back exactly ($ is resolved later, at exec time, so none is in these words)."""
    for word in [
        "/no such/x\nExecStartPre=/bin/touch pwned",
        "/no/q\"'x",
        "/no/50%",
        "/no/t\tab\\",
        "/no/é",
        "/no/a;b",
    ]:
        unit = tmp_path / "w.service"
        unit.write_text(f"[Service]\nExecStart={quote(word)} --x\n")
        said = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True).stderr
        assert f"Command {word} is not executable" in said or f"special characters: {word}\n" in said, (word, said)


def test_what_a_unit_cannot_hold_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    bad = os.fsdecode(b"/models/caf\xe9.gguf")  # a Latin-1 file name: bytes that are not UTF-8
    r = service(["install", "x", "--no-check", "--", bad], tmp_path)
    assert r.returncode == 2 and "not UTF-8 text" in r.stderr and "$'/models/caf\\xe9.gguf'" in r.stderr, r.stderr
    folder = tmp_path / "config" / "systemd" / "user"
    assert not folder.exists() or not list(folder.iterdir())  # no unit, no temporary file
    with pytest.raises(UsageError, match="control character"):
        render("x", ["m.gguf", "--", "--alias", "a\x1bb"], {"HOME": "/h"}, "launchd")
    agent = render("x", ["m.gguf", "--", "--alias", "a\nb"], {"HOME": "/h"}, "launchd")
    assert plistlib.loads(agent.text.encode())["ProgramArguments"][-1] == "a\nb"


def test_the_unit_keeps_what_planning_reads_and_no_token(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1", "LLAMA_CACHE": "/c", "HF_ENDPOINT": "https://hub.local", "XDG_DATA_HOME": "/d",
        "XDG_CACHE_HOME": "/k", "HF_TOKEN": "hf_secret", "LLAMA_API_KEY": "k3y",
    }  # fmt: skip
    unit = render("x", ["m.gguf"], env, "systemd")
    _, kept = read_service(unit.text)
    assert {k: kept[k] for k in ("CUDA_VISIBLE_DEVICES", "LLAMA_CACHE", "HF_ENDPOINT", "XDG_DATA_HOME")} == {
        k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "LLAMA_CACHE", "HF_ENDPOINT", "XDG_DATA_HOME")
    }
    assert "hf_secret" not in unit.text and "k3y" not in unit.text
    assert unit.dropped == ("HF_TOKEN", "LLAMA_API_KEY") and unit.secrets == ()
    r = subprocess.run(
        [*LLAMAFIT, "service", "install", "x", "--no-check", "--", "m.gguf", "--", "--api-key", "K"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    path = tmp_path / "config" / "systemd" / "user" / "llamafit-x.service"
    assert path.stat().st_mode & 0o777 == 0o600
    assert "the unit holds a secret (--api-key)" in r.stderr and "HF_TOKEN is not written into the unit" in r.stderr
    again = subprocess.run(
        [*LLAMAFIT, "service", "install", "x", "--no-check", "--", "other.gguf"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )  # fmt: skip
    assert again.returncode == 2 and "is installed already and runs something else" in again.stderr
    assert "--api-key" in path.read_text()  # the first unit is untouched
    same = subprocess.run(
        [*LLAMAFIT, "service", "install", "x", "--no-check", "--", "m.gguf", "--", "--api-key", "K"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )  # fmt: skip
    assert same.returncode == 0, same.stderr  # the same unit again is no conflict


def test_the_check_refuses_what_run_refuses_at_every_boot(tmp_path: Path) -> None:
    cases = {
        ("--gpu", "24GiB"): "--gpu describes hardware that is not here",
        ("--host-ram", "8GiB"): "--host-ram describes hardware that is not here",
        ("--metrics", "0"): "--metrics takes PORT or HOST:PORT",
        ("--metrics", "notaport"): "--metrics takes PORT or HOST:PORT",
        ("--events", str(tmp_path / "none" / "e.jsonl")): "does not exist",
        ("--dry-run",): "the service would print the argv and stop",
    }
    for args, said in cases.items():
        r = service(["install", "x", "--", "m.gguf", *args], tmp_path)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr)
        assert not (tmp_path / "config" / "systemd" / "user" / "llamafit-x.service").exists()


@pytest.mark.server
def test_install_show_list_remove(tmp_path: Path, server_bin: ServerBinary) -> None:
    model = ensure_demo_model(tmp_path / "m")
    r = service(["install", "demo", "--", str(model), "--liveness", "30", "--", "--alias", "a b%c"], tmp_path,
                server_bin.path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "llamafit-demo.service"
    text = unit.read_text()
    assert f'ExecStart={sys.executable} -m llamafit run {model} --liveness 30 -- --alias "a b%%c"' in text
    assert "KillMode=mixed" in text and "Restart=on-failure" in text and "StartLimitBurst=5" in text
    assert f"Environment=LLAMAFIT_SERVER={server_bin.path}" in text
    assert "systemctl --user enable --now llamafit-demo.service" in r.stderr
    if HAS_SYSTEMD:  # what install checked, checked again here
        assert subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True).returncode == 0
    assert service(["show", "demo"], tmp_path).stdout.strip() == text.strip()
    assert service(["list"], tmp_path).stdout.strip() == str(unit)
    assert service(["remove", "demo"], tmp_path).returncode == 0 and not unit.exists()
    gone = service(["remove", "demo"], tmp_path)
    assert gone.returncode == 2 and "no unit" in gone.stderr


@pytest.mark.server
def test_arguments_that_do_not_plan_write_nothing(tmp_path: Path, server_bin: ServerBinary) -> None:
    r = service(["install", "bad", "--", str(tmp_path / "missing.gguf")], tmp_path, server_bin.path)
    assert r.returncode == 2 and "do not plan here (exit 4): model file not found" in r.stderr, r.stderr
    assert not (tmp_path / "config" / "systemd" / "user" / "llamafit-bad.service").exists()


def test_a_folder_that_cannot_be_written_and_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("a file where the folder would be")
    r = service(["install", "x", "--no-check", "--", "m.gguf"], tmp_path)
    assert r.returncode == 2 and "cannot write the unit" in r.stderr, r.stderr
    bad = service(["install", "../x", "--no-check", "--", "m.gguf"], tmp_path)
    assert bad.returncode == 2 and "a service name is" in bad.stderr


@pytest.mark.skipif(not HAS_SYSTEMD, reason="systemd-analyze is not installed here")
def test_a_unit_its_checker_refuses_is_not_installed(tmp_path: Path) -> None:
    good = render("x", ["m.gguf"], {"HOME": str(tmp_path)}, "systemd")
    broken = Unit(good.name, good.path, good.text.replace(f"ExecStart={sys.executable}", "ExecStart=not-a-program"),
                  good.kind)  # fmt: skip
    with pytest.raises(UsageError, match="refused by its checker"):
        install(broken)
    assert not broken.path.exists()


def test_the_launchd_agent() -> None:
    unit = render("demo", ["m.gguf", "--", "--port", "8080"], {"HOME": "/Users/me", "PATH": "/usr/bin"}, "launchd")
    plist = plistlib.loads(unit.text.encode())
    assert str(unit.path) == "/Users/me/Library/LaunchAgents/dev.llamafit.demo.plist"
    assert plist["ProgramArguments"][-4:] == ["m.gguf", "--", "--port", "8080"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["EnvironmentVariables"] == {"PATH": "/usr/bin"}
