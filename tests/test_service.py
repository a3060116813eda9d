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
from llamafit.service import Unit, install, render, systemd_quote

LLAMAFIT = [sys.executable, "-m", "llamafit"]
HAS_SYSTEMD = shutil.which("systemd-analyze") is not None


def service(args: list[str], home: Path, server: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"))
    if server:
        env["LLAMAFIT_SERVER"] = server
    return subprocess.run([*LLAMAFIT, "service", *args], capture_output=True, text=True, env=env, timeout=300)


def test_systemd_words() -> None:
    assert systemd_quote("plain/path.gguf") == "plain/path.gguf"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert systemd_quote("50%") == "50%%" and systemd_quote("$HOME") == "$$HOME"  # specifiers, variables


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
