"""From ``owner/repo[:QUANT]`` to a model the planner can size, without downloading weights.

The files are chosen as llama-server's ``-hf`` chooses them (``llamafit.hub.select``); each is known by
the path it has (or will have) in the shared Hugging Face cache, ``snapshots/<commit>/<path>``, so the
plan's argv names local files (``-m``, ``-mm``, ``-md``) and is the same before and after the
download. Headers come from the cached file when it is there, else from the network (Range reads,
cached). Listing online falls back to the cache listing when the network fails, as llama.cpp does
(``common/download.cpp:699-707``); offline (``--offline`` or ``HF_HUB_OFFLINE=1``) uses only the cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llamafit.errors import AccessError, LlamafitError, ModelNotFoundError, NetworkError
from llamafit.gguf.extents import read_remembered
from llamafit.gguf.mmproj import Projector, projector_from_header
from llamafit.gguf.model import ModelInfo, load_model, model_from_headers
from llamafit.gguf.naming import SIDECARS
from llamafit.gguf.reader import GGUFHeader
from llamafit.hub.cache import COMMIT_ID, cached_commit, cached_files, hub_cache_dir, is_cached, snapshot_path
from llamafit.hub.select import (
    HubFile,
    find_best_model,
    gguf_names,
    missing_shards,
    quants,
    select,
    split_files,
    split_repo_tag,
)
from llamafit.units import fmt_bytes

if TYPE_CHECKING:
    from llamafit.hub.remote import HubClient


def offline_from_env(env: dict[str, str] | None = None) -> bool:
    e = os.environ if env is None else env
    return e.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def is_hub_ref(text: str) -> bool:
    """A MODEL argument that names a Hub repo rather than a file: not an existing path, and
    ``owner/name[:QUANT]`` with no file suffix."""
    if os.path.exists(text) or text.endswith(".gguf") or text.startswith((".", "/", "~")):
        return False
    repo = text.split(":")[0]
    return repo.count("/") == 1 and all(repo.split("/"))


@dataclass(frozen=True)
class RepoState:
    """One repo at one commit: what it holds."""

    repo: str
    branch: str  # the revision asked for when it is a name (refs/<branch>), "" for a commit
    commit: str
    files: tuple[HubFile, ...]
    from_cache: bool  # listed from the local cache (offline, or the network failed)


@dataclass(frozen=True)
class HubModel:
    """A Hub model resolved for planning."""

    state: RepoState
    tag: str
    model: ModelInfo
    files: tuple[HubFile, ...]  # the model's shards
    mmproj: Projector | None = None
    mmproj_file: HubFile | None = None
    notes: tuple[str, ...] = ()


@dataclass
class Hub:
    """Resolves Hub references and remembers every file it resolved, for drafters and downloads."""

    offline: bool = False
    hub_dir: Path = field(default_factory=hub_cache_dir)
    # the Hub's HTTP client, made when it is first needed (a plan of a local file or a cached repo never needs it)
    client: HubClient | None = None
    cache: Path | None = None  # where the client keeps the headers it read (None: its default)
    known: dict[str, tuple[RepoState, HubFile]] = field(default_factory=dict)  # local path -> origin
    tags: dict[str, str] = field(default_factory=dict)  # model path -> the quant tag it was asked with
    _states: dict[tuple[str, str | None], RepoState] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def remote(self) -> HubClient:
        if self.client is None:
            from llamafit.hub.remote import HubClient

            self.client = HubClient(cache_dir=self.cache) if self.cache is not None else HubClient()
        return self.client

    # -- listing -----------------------------------------------------------------------------------

    def state(self, repo: str, revision: str | None = None) -> RepoState:
        key = (repo, revision)
        if key in self._states:
            return self._states[key]
        branch = "" if revision and COMMIT_ID.match(revision) else (revision or "main")
        st: RepoState | None = None
        if not self.offline:
            try:
                listing = self.remote.listing(repo, revision)
                st = RepoState(repo, branch, listing.commit, listing.files, False)
            except (AccessError, ModelNotFoundError):
                raise
            except NetworkError as e:
                st = self._from_cache(repo, revision, branch)
                if st is None:
                    raise
                self.notes.append(f"the Hub could not be reached ({e.message}); using the cached copy of {repo}")
        else:
            st = self._from_cache(repo, revision, branch)
            if st is None:
                raise ModelNotFoundError(
                    f"{repo} is not in the Hugging Face cache ({self.hub_dir}) and offline mode is on",
                    hint="download it once online (llamafit run, or hf download), or drop --offline",
                )
        self._states[key] = st
        return st

    def _from_cache(self, repo: str, revision: str | None, branch: str) -> RepoState | None:
        commit = cached_commit(self.hub_dir, repo, revision)
        if commit is None:
            return None
        return RepoState(repo, branch, commit, tuple(cached_files(self.hub_dir, repo, commit)), True)

    # -- files -------------------------------------------------------------------------------------

    def remember(self, st: RepoState, f: HubFile) -> str:
        """The path a Hub file will have in the cache, remembered as one this plan may use (``pending``,
        ``exists``, ``size`` and ``open`` answer for it before it is downloaded)."""
        p = str(snapshot_path(self.hub_dir, st.repo, st.commit, f.path))
        self.known[p] = (st, f)
        return p

    def header(self, st: RepoState, f: HubFile) -> GGUFHeader:
        """From the cached file when it is whole, else over the network."""
        if st.from_cache or is_cached(self.hub_dir, st.repo, st.commit, f):
            path = snapshot_path(self.hub_dir, st.repo, st.commit, f.path)
            if path.exists():
                return read_remembered(path)
            raise ModelNotFoundError(
                f"{st.repo}/{f.path} is listed in the cache but its file is missing (a broken link)",
                hint="download it again, online",
            )
        if self.offline:
            raise ModelNotFoundError(f"{st.repo}/{f.path} is not in the cache (offline mode)")
        return self.remote.header(st.repo, st.commit, f)

    def model(self, st: RepoState, shards: Sequence[HubFile]) -> ModelInfo:
        missing = missing_shards(shards)
        if missing:
            raise ModelNotFoundError(
                f"{st.repo}: {shards[0].path} is a split set, but the listing lacks shard(s) "
                + ", ".join(str(i) for i in missing),
                hint="the upload may be incomplete; pick another quant or wait for it",
            )
        headers = [self.header(st, f) for f in shards]
        return model_from_headers(headers, [self.remember(st, f) for f in shards])

    # -- references --------------------------------------------------------------------------------

    def resolve_model(
        self, ref: str, *, hf_file: str | None = None, revision: str | None = None, mmproj: bool = True
    ) -> HubModel:
        repo, tag = split_repo_tag(ref)
        st = self.state(repo, revision)
        sel = select(st.files, repo, tag, hf_file, mmproj=mmproj)
        if sel.primary is None:
            names = gguf_names(st.files)
            if hf_file:
                raise ModelNotFoundError(
                    f"{repo} has no file {hf_file}",
                    hint=("files there: " + ", ".join(names[:12])) if names else "the repo has no GGUF files",
                )
            if not names:
                raise ModelNotFoundError(f"{repo} has no GGUF files", hint="llama-server loads GGUF models")
            raise ModelNotFoundError(
                f"{repo} has no {tag} model file", hint="quants there: " + (", ".join(quants(st.files)) or "none")
            )
        model = self.model(st, sel.model_files)
        self.tags[model.path] = tag
        projector = None
        if sel.mmproj is not None:
            try:
                projector = projector_from_header(self.header(st, sel.mmproj), self.remember(st, sel.mmproj))
            except LlamafitError as e:
                self.notes.append(f"the projector {sel.mmproj.path} was left out: {e.message}")
        return HubModel(
            st, tag, model, sel.model_files, projector, sel.mmproj if projector else None, tuple(self.notes)
        )

    def resolve_draft(self, ref: str, *, revision: str | None = None, kinds: Sequence[str] = ()) -> str:
        """A draft repo (``--draft owner/repo[:QUANT]``, ``-hfd``): its sidecar of the asked kind, or of
        any kind in llama.cpp's priority (MTP > DSpark > DFlash > EAGLE3) when none is asked, else its
        own best model (common/arg.cpp:546-630). Returns the file's local path."""
        repo, tag = split_repo_tag(ref)
        st = self.state(repo, revision)
        primary = find_best_model(st.files, tag)
        sel = select(st.files, repo, tag, mmproj=False, sidecar_kinds=kinds or [k for k, _ in SIDECARS])
        for kind, _ in SIDECARS:
            if kind in sel.sidecars:
                return self.remember(st, sel.sidecars[kind])
        if primary is None:
            raise ModelNotFoundError(
                f"{repo} has no {tag or 'usable'} draft model", hint="quants there: " + ", ".join(quants(st.files))
            )
        for f in split_files(st.files, primary):
            self.remember(st, f)
        return self.remember(st, primary)

    # -- drafters (speculative.DrafterFiles) -------------------------------------------------------

    def sidecars(self, target_path: str) -> dict[str, str]:
        """Drafter sidecars the target's repo ships, by kind (find_best_sibling with the tag)."""
        origin = self.known.get(target_path)
        if origin is None:
            from llamafit.speculative import find_sidecars

            return find_sidecars(target_path)
        st, f = origin
        sel = select(
            st.files,
            st.repo,
            self.tags.get(target_path, ""),
            f.path,
            mmproj=False,
            sidecar_kinds=[k for k, _ in SIDECARS],
        )
        return {kind: self.remember(st, hf) for kind, hf in sel.sidecars.items()}

    def exists(self, path: str) -> bool:
        # a local drafter as LocalFiles takes one: a regular file (a folder or a FIFO is none, and would block)
        return path in self.known or os.path.isfile(path)

    def size(self, path: str) -> int | None:
        if path in self.known:
            return self.known[path][1].size
        try:
            return os.path.getsize(path)
        except OSError:
            return None

    def open(self, path: str) -> ModelInfo:
        if path not in self.known:
            return load_model(path)
        st, f = self.known[path]
        return self.model(st, split_files(st.files, f))

    # -- downloads ---------------------------------------------------------------------------------

    def pending(self, paths: Iterable[str]) -> list[tuple[RepoState, HubFile]]:
        """The Hub files behind ``paths`` (and their split siblings) that the cache does not hold whole."""
        out: list[tuple[RepoState, HubFile]] = []
        for p in paths:
            if p not in self.known:
                continue
            st, f = self.known[p]
            for g in split_files(st.files, f):
                if not is_cached(self.hub_dir, st.repo, st.commit, g) and (st, g) not in out:
                    out.append((st, g))
        return out

    def download(self, items: Sequence[tuple[RepoState, HubFile]]) -> None:
        if items and self.offline:
            raise ModelNotFoundError(
                f"{len(items)} file(s) the plan uses are not in the cache and offline mode is on: "
                + ", ".join(f"{st.repo}/{f.path}" for st, f in items[:4]),
                hint="run once without --offline",
            )
        done: set[tuple[str, str]] = set()
        for st, f in items:
            self.remote.download(st.repo, st.commit, f, self.hub_dir)
            done.add((st.repo, st.branch))
        for st, _ in items:
            if st.branch and (st.repo, st.branch) in done:
                from llamafit.hub.remote import write_ref

                write_ref(self.hub_dir, st.repo, st.branch, st.commit)


def downloads_line(pending: Sequence[tuple[RepoState, HubFile]], verb: str) -> str:
    """``verb N file(s), SIZE: repo/path, ...`` for Hub files a plan uses that the cache lacks."""
    total = sum(f.size for _, f in pending)
    names = ", ".join(f"{st.repo}/{f.path}" for st, f in pending[:3]) + (" ..." if len(pending) > 3 else "")
    return f"{verb} {len(pending)} file(s), {fmt_bytes(total)}: {names}"
