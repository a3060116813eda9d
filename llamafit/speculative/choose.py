"""Which drafter the options ask for, before memory is considered: embedded NextN, a sidecar, -md, --draft."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from llamafit.errors import AccessError, LlamafitError, ModelNotFoundError, NetworkError, UsageError
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.gguf.naming import SIDECARS
from llamafit.speculative.kinds import (
    DRAFT_TYPES,
    NGRAM_TYPES,
    detect_kind,
    find_sidecars,
    has_embedded_mtp,
)
from llamafit.speculative.options import SpecOptions


class DrafterFiles(Protocol):
    """Where drafter files are found and read: the local disk, or a Hub repo (llamafit.hub.resolve.Hub)."""

    def sidecars(self, target_path: str) -> dict[str, str]: ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int | None: ...

    def open(self, path: str) -> ModelInfo: ...


class LocalFiles:
    def sidecars(self, target_path: str) -> dict[str, str]:
        return find_sidecars(target_path)

    def exists(self, path: str) -> bool:
        # a regular file only: a folder or a FIFO given as a drafter is not one (and a FIFO would block)
        return os.path.isfile(path)

    def size(self, path: str) -> int | None:
        try:
            return os.path.getsize(path)
        except OSError:
            return None

    def open(self, path: str) -> ModelInfo:
        return load_model(path)


@dataclass(frozen=True)
class Drafter:
    kind: str  # one of DRAFT_TYPES
    path: str | None  # None: the target's own NextN head
    model: ModelInfo | None  # None when the drafter could not be sized
    source: str  # embedded | sidecar | --draft | extra args
    known_bytes: int = 0  # file bytes known for an unsized drafter

    @property
    def sized(self) -> bool:
        return self.path is None or self.model is not None

    @property
    def embedded(self) -> bool:
        return self.path is None


@dataclass(frozen=True)
class SpecChoice:
    """What the options ask for before memory is considered."""

    drafter: Drafter | None
    ngram: str | None  # an ngram type requested alongside or instead of a drafter
    explicit: bool
    notes: tuple[str, ...] = ()


def _open_drafter(path: str, source: str, kind_hint: str | None, files: DrafterFiles) -> Drafter:
    """Read a drafter's header(s). A file that exists but cannot be read (or a split set listed only in
    part) is *unsized*: priced with a reserve and reported, rather than refused (llama-server, not
    llamafit, has the last word on it)."""
    if not files.exists(path):
        what = "is not a file" if os.path.exists(path) else "not found"
        raise ModelNotFoundError(f"drafter {path} {what}", hint="give a GGUF file with --draft / -md")
    try:
        m = files.open(path)
    except (AccessError, NetworkError):
        raise
    except LlamafitError:
        return Drafter(kind_hint or "draft-simple", path, None, source, known_bytes=files.size(path) or 0)
    return Drafter(kind_hint or detect_kind(m) or "draft-simple", path, m, source)


def choose(target: ModelInfo, opts: SpecOptions, files: DrafterFiles | None = None) -> SpecChoice:
    """Which drafter (and ngram type) the options ask for; no memory considered yet."""
    files = files or LocalFiles()
    notes: list[str] = []
    user_draft_types = [t for t in opts.user_types if t in DRAFT_TYPES]
    ngram = next((t for t in reversed(opts.user_types) if t in NGRAM_TYPES), None)
    if opts.user_types:
        # the user's --spec-type is final (it accumulates in llama-server; llamafit adds none)
        kind = user_draft_types[-1] if user_draft_types else None
        if kind is None:
            return SpecChoice(None, ngram, True)
        path = opts.user_draft or opts.draft
        if path:
            return SpecChoice(
                _open_drafter(path, "extra args" if opts.user_draft else "--draft", kind, files), ngram, True
            )
        if kind == "draft-mtp" and has_embedded_mtp(target):
            return SpecChoice(Drafter(kind, None, target, "embedded"), ngram, True)
        if opts.user_draft_hf:
            return SpecChoice(Drafter(kind, opts.user_draft_hf, None, "extra args"), ngram, True)
        side = files.sidecars(target.path).get(kind)
        if side:
            return SpecChoice(_open_drafter(side, "sidecar", kind, files), ngram, True)
        notes.append(f"--spec-type {kind} has no drafter to load (no -md, no NextN head, no sidecar)")
        return SpecChoice(None, ngram, True, tuple(notes))

    if opts.mode == "off":
        return SpecChoice(None, None, True)
    if opts.mode in NGRAM_TYPES:
        return SpecChoice(None, opts.mode, True)
    path = opts.user_draft or opts.draft
    source = "extra args" if opts.user_draft else "--draft"
    if opts.mode in DRAFT_TYPES:
        if path:
            return SpecChoice(_open_drafter(path, source, opts.mode, files), None, True)
        if opts.mode == "draft-mtp" and has_embedded_mtp(target):
            return SpecChoice(Drafter("draft-mtp", None, target, "embedded"), None, True)
        side = files.sidecars(target.path).get(opts.mode)
        if side:
            return SpecChoice(_open_drafter(side, "sidecar", opts.mode, files), None, True)
        raise UsageError(
            f"--spec {opts.mode}: no drafter found for it",
            hint="give one with --draft PATH"
            + (" (this model has no NextN/MTP layers)" if opts.mode == "draft-mtp" else ""),
        )
    # auto
    if path:
        return SpecChoice(_open_drafter(path, source, None, files), None, True)
    if opts.user_draft_hf:
        return SpecChoice(Drafter("draft-simple", opts.user_draft_hf, None, "extra args"), None, True)
    if has_embedded_mtp(target):
        return SpecChoice(Drafter("draft-mtp", None, target, "embedded"), None, False)
    sidecars = files.sidecars(target.path)
    for kind, _ in SIDECARS:
        if kind in sidecars:
            return SpecChoice(_open_drafter(sidecars[kind], "sidecar", kind, files), None, False)
    return SpecChoice(None, None, False)
