"""The Hugging Face cache shared with llama.cpp and huggingface_hub (docs/server-cli.md §5).

The directory is found with llama.cpp's precedence (``common/hf-cache.cpp:33-62``): ``LLAMA_CACHE``
(itself, no ``/hub``), ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``,
``$XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``; empty values count as unset. The
layout is ``models--owner--name/{refs,blobs,snapshots}``; a repo's cached files are those under
``snapshots/<commit>`` for the commit in ``refs/main`` (else the first ref file), as
``get_cached_files`` reads them (``hf-cache.cpp:353-438``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from llamafit.hub.select import HubFile

COMMIT_ID = re.compile(r"^[0-9a-f]{40}$")


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    e = os.environ if env is None else env
    for var, suffix in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub")):
        if e.get(var):
            return Path(e[var]) / suffix if suffix else Path(e[var])
    if e.get("XDG_CACHE_HOME"):
        return Path(e["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    home = e.get("HOME") or str(Path.home())
    return Path(home) / ".cache" / "huggingface" / "hub"


def repo_folder(hub: Path, repo: str) -> Path:
    return hub / ("models--" + repo.replace("/", "--"))


def snapshot_path(hub: Path, repo: str, commit: str, path: str) -> Path:
    return repo_folder(hub, repo) / "snapshots" / commit / path


def cached_commit(hub: Path, repo: str, revision: str | None = None) -> str | None:
    """The commit the cache holds for ``revision`` (a branch name or a commit), else for main."""
    refs = repo_folder(hub, repo) / "refs"
    if revision and COMMIT_ID.match(revision):
        return revision if (repo_folder(hub, repo) / "snapshots" / revision).is_dir() else None
    names = [revision] if revision else ["main"]
    for name in names:
        try:
            c = (refs / name).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if COMMIT_ID.match(c):
            return c
    if revision:
        return None
    try:
        for entry in sorted(refs.iterdir()):
            if entry.is_file():
                c = entry.read_text(encoding="ascii", errors="replace").strip()
                if COMMIT_ID.match(c):
                    return c
    except OSError:
        pass
    return None


def cached_files(hub: Path, repo: str, commit: str) -> list[HubFile]:
    """Every file under the snapshot, repo-relative, sorted (a broken link is listed with size 0)."""
    root = repo_folder(hub, repo) / "snapshots" / commit
    out: list[HubFile] = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            full = Path(dirpath) / n
            try:
                size = full.stat().st_size
            except OSError:
                size = 0
            out.append(HubFile(full.relative_to(root).as_posix(), size))
    out.sort(key=lambda f: f.path)
    return out


def is_cached(hub: Path, repo: str, commit: str, f: HubFile) -> bool:
    """The snapshot holds ``f`` whole (its link resolves and the size matches the listing)."""
    try:
        return snapshot_path(hub, repo, commit, f.path).stat().st_size == f.size
    except OSError:
        return False


def cached_repos(hub: Path | None = None) -> list[str]:
    """Model repos in the cache (``models--owner--name`` folders with snapshots), as owner/name."""
    from llamafit.hub.select import is_valid_repo_id

    root = hub or hub_cache_dir()
    out = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for d in entries:
        name = d.name
        if not name.startswith("models--") or not (d / "snapshots").is_dir():
            continue
        repo = name[len("models--") :].replace("--", "/")
        if is_valid_repo_id(repo):
            out.append(repo)
    return out
