"""Start on boot: a service unit that runs ``llamafit run ...`` (a systemd user unit on Linux, a launchd agent
on macOS), written, verified by the platform's own checker where it is installed, shown and removed.

The unit runs llamafit, not llama-server: every start plans again for the machine as it is then, and
llamafit keeps the server alive (``--restart``, liveness); the service manager restarts llamafit itself
if it gives up (bounded: ``StartLimitBurst``). SIGTERM reaches llamafit, which stops the server within
its grace (30 s) before the manager's ``TimeoutStopSec`` kills what is left (``KillMode=mixed``).

Every argument is written as the manager reads it back (``llamafit.serving.unit_syntax``), and the written text is
read back and compared with what was meant before anything is installed: no argument can add a line to the
unit. The environment kept is what planning reads (the devices shown, the caches, the Hub's address) and
llamafit's own variables, never a token; a unit is written readable by its owner alone (0600), and one that
holds a secret the user put in its arguments says so. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llamafit.devices.listed import SELECTION_VARS
from llamafit.errors import UsageError
from llamafit.server.bounded import run_bounded
from llamafit.serving import unit_syntax

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# what planning and the server read from the environment: the devices a backend shows, where models and caches
# are, the Hub's address; and llamafit's own. LLAMA_ARG_* are not kept: the server's child environment drops them
KEPT_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LLAMAFIT_SERVER",
    "LLAMAFIT_CACHE",
    "LLAMAFIT_DATA",
    "LLAMAFIT_PROBE",
    "LLAMAFIT_HUB_TIMEOUT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "MODEL_ENDPOINT",
    "LLAMA_CACHE",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "CUDA_DEVICE_ORDER",
    *SELECTION_VARS,  # which devices each backend shows: the service plans for the ones the caller saw
)
# secrets the environment may hold, never written into a unit: where the service finds them instead
SECRET_ENV = {
    "HF_TOKEN": "hf auth login stores the token where the service reads it",
    "HUGGING_FACE_HUB_TOKEN": "hf auth login stores the token where the service reads it",
    "LLAMA_API_KEY": "give the server --api-key-file FILE among the unit's arguments",
}
SECRET_FLAGS = ("--api-key", "--hf-token", "-hft")  # llama-server options whose value is a secret
VERIFY_TIMEOUT = 30.0


@dataclass(frozen=True)
class Unit:
    name: str
    path: Path
    text: str
    kind: str  # "systemd" | "launchd"
    secrets: tuple[str, ...] = ()  # what the unit holds that is a secret (a flag or a variable's name)
    dropped: tuple[str, ...] = ()  # secret variables of the caller's environment left out of it


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UsageError(
            f"a service name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit: {name!r}"
        )
    return name


def kind_here() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def unit_path(name: str, kind: str, env: Mapping[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    if kind == "launchd":
        return home / "Library" / "LaunchAgents" / f"dev.llamafit.{name}.plist"
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return config / "systemd" / "user" / f"llamafit-{name}.service"


def command(run_args: Sequence[str]) -> list[str]:
    """The unit's command: this Python running llamafit's ``run`` with the user's arguments."""
    return [sys.executable, "-m", "llamafit", "run", *run_args]


def render(name: str, run_args: Sequence[str], env: Mapping[str, str], kind: str) -> Unit:
    """The unit for ``run_args``; a UsageError (exit 2) for an argument or variable a unit cannot hold, and the
    text read back as the manager reads it, so that what runs is exactly what was asked."""
    argv = command(run_args)
    kept = {k: env[k] for k in KEPT_ENV if env.get(k)}
    path = unit_path(name, kind, env)
    secrets = tuple(dict.fromkeys(_secrets(argv, kept)))
    dropped = tuple(k for k in SECRET_ENV if env.get(k))
    if kind == "launchd":
        text = _plist(name, argv, kept, env)
        back = plistlib.loads(text.encode())
        if back["ProgramArguments"] != argv or back["EnvironmentVariables"] != kept:
            raise UsageError("the agent would not run what was asked (its arguments read back otherwise)")
        return Unit(name, path, text, kind, secrets, dropped)
    lines = [
        "[Unit]",
        f"Description=llama-server planned by llamafit ({name})",
        "After=network-online.target",
        "Wants=network-online.target",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + unit_syntax.exec_line(argv),
        *(f"Environment={unit_syntax.environment_word(k, v)}" for k, v in kept.items()),
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM to llamafit alone (it stops the server within 30 s), then SIGKILL to whatever is left
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=45",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    text = "\n".join(lines)
    try:
        exec_back, env_back = unit_syntax.read_service(text)
    except ValueError as e:
        raise UsageError(f"the unit would not read back as written ({e})") from None
    if exec_back != argv or env_back != kept:
        raise UsageError("the unit would not run what was asked (its ExecStart or Environment reads back otherwise)")
    return Unit(name, path, text, kind, secrets, dropped)


def _plist(name: str, argv: Sequence[str], kept: Mapping[str, str], env: Mapping[str, str]) -> str:
    """A launchd agent's property list; a UsageError for what XML cannot hold (bytes that are not UTF-8, control
    characters other than tab, newline and carriage return)."""
    for word in [*argv, *kept.values()]:
        unit_syntax.check_text(word)
        if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", word):
            raise UsageError(
                f"a launchd agent cannot hold this argument (a control character): {unit_syntax.shown(word)}",
                hint="rename the file or drop the character",
            )
    plist = {
        "Label": f"dev.llamafit.{name}",
        "ProgramArguments": list(argv),
        "EnvironmentVariables": dict(kept),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # started again when it fails, not after a clean stop
        "ThrottleInterval": 10,
        "ExitTimeOut": 45,  # llamafit's 30 s to stop the server, and some
        "StandardErrorPath": str(Path(env.get("HOME") or Path.home()) / "Library" / "Logs" / f"llamafit-{name}.log"),
    }
    return plistlib.dumps(plist).decode()


def _secrets(argv: Sequence[str], kept: Mapping[str, str]) -> list[str]:
    """The secrets a unit for ``argv`` and ``kept`` would hold: a key or token given as an argument, a password
    in the Hub's address."""
    out = [a for i, a in enumerate(argv[:-1]) if a in SECRET_FLAGS and argv[i + 1]]
    for k in ("HF_ENDPOINT", "MODEL_ENDPOINT"):
        with contextlib.suppress(ValueError):
            if k in kept and urlsplit(kept[k]).password:
                out.append(f"{k} (a password)")
    return out


def existing(unit: Unit) -> str | None:
    """The text of a unit already installed under this name, when it differs from ``unit``'s (None: nothing
    there, or the same unit)."""
    try:
        text = unit.path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return None if text == unit.text else text


def verify(unit: Unit) -> str | None:
    """The platform checker's complaint about the written unit (None: it found none, or none is installed)."""
    tool = ["systemd-analyze", "verify"] if unit.kind == "systemd" else ["plutil", "-lint"]
    if shutil.which(tool[0]) is None:
        return None
    try:
        r = run_bounded([*tool, str(unit.path)], env=None, timeout=VERIFY_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{tool[0]} did not answer within {VERIFY_TIMEOUT:.0f} s"
    except OSError as e:
        return f"{tool[0]} could not run: {e.strerror or e}"
    if r.returncode == 0:
        return None
    said = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
    return "; ".join(said)[-2000:] or f"{tool[0]} exited with {r.returncode}"


def install(unit: Unit) -> None:
    """Write the unit readable by its owner alone (a file that is there already is replaced whole), then hold it
    to the checker: a unit it refuses is removed again. A UsageError says what went wrong; nothing is left
    half-written, and no temporary file is left behind."""
    data = unit.text.encode("utf-8")  # render refused what is not text: this cannot fail after the file is open
    tmp = unit.path.with_name(unit.path.name + ".tmp")
    try:
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.fchmod(fd, 0o600)  # a stale temporary file keeps its mode through O_CREAT
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, unit.path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(
            f"cannot write the unit {unit.path}: {e.strerror or e}",
            hint="check that folder's permissions (XDG_CONFIG_HOME moves it)",
        ) from None
    complaint = verify(unit)
    if complaint is not None:
        unit.path.unlink(missing_ok=True)
        raise UsageError(f"the unit was refused by its checker and not installed: {complaint}")


def remove(path: Path) -> bool:
    """Whether a unit was there to remove."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UsageError(f"cannot remove {path}: {e.strerror or e}") from None
    return True


def installed(env: Mapping[str, str], kind: str) -> list[Path]:
    folder = unit_path("x", kind, env).parent
    pattern = "dev.llamafit.*.plist" if kind == "launchd" else "llamafit-*.service"
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def next_steps(unit: Unit) -> list[str]:
    if unit.kind == "launchd":
        return [f"launchctl load -w {unit.path}"]
    svc = unit.path.name
    return ["systemctl --user daemon-reload", f"systemctl --user enable --now {svc}", f"journalctl --user -u {svc} -f"]
