"""Which drafter the options ask for, before memory is considered: embedded NextN, a sidecar, -md, --draft."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from llamafit.errors import AccessError, LlamafitError, ModelNotFoundError, NetworkError, UsageError
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.gguf.naming import SIDECARS
from llamafit.memory.builds import MIRRORED, MTP_GRAPH_SINCE, mtp_graph
from llamafit.speculative.flags import SpecOptions
from llamafit.speculative.kinds import (
    DRAFT_TYPES,
    NGRAM_TYPES,
    detect_kind,
    find_sidecars,
    has_embedded_mtp,
)


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


def mismatch(target: ModelInfo, d: Drafter) -> str | None:
    """Why a drafter that reads the target's hidden states cannot serve this target, or None. llama-server
    aborts on these at its first reserve (a GGML_ASSERT, SIGABRT): a DFlash/DSpark drafter's blocks take
    the target's token rows and features at its own width (dflash.cpp:40, speculative.cpp:1035-1037), an
    EAGLE3 drafter's fusion layer the width it names (eagle3.cpp:17-22), and both ask for the inputs of
    target layers that must exist (llama-context.cpp:1242)."""
    m = d.model
    if m is None or d.kind not in ("draft-dflash", "draft-dspark", "draft-eagle3"):
        return None
    width = m.kv.get(f"{m.arch}.target_hidden_size") if d.kind == "draft-eagle3" else m.hparams.n_embd
    n_embd = target.hparams.n_embd
    if isinstance(width, int) and width != n_embd:
        return f"it reads hidden states {width} wide and this model's are {n_embd} wide"
    layers = m.kv.get(f"{m.arch}.target_layers")
    n_layer = target.hparams.n_layer
    if isinstance(layers, list) and any(isinstance(x, int) and x > n_layer for x in layers):
        return f"it reads target layer {max(layers)} and this model has {n_layer} layers"
    return None


def _refuse_mismatch(target: ModelInfo, d: Drafter) -> None:
    """An explicitly chosen drafter is refused when llama-server would abort on it."""
    if (why := mismatch(target, d)) is not None:
        raise UsageError(
            f"drafter {d.path} was made for another model: {why}; llama-server would abort loading it",
            hint="give the drafter trained for this model (its sidecar: dflash-, dspark-, eagle3-), or --spec off",
        )


def choose(
    target: ModelInfo, opts: SpecOptions, files: DrafterFiles | None = None, build: int = MIRRORED
) -> SpecChoice:
    """Which drafter (and ngram type) the options ask for; no memory considered yet. A drafter that
    cannot serve this target is refused when asked for and passed over when Auto finds it beside it; so
    is a NextN head on a ``build`` without the architecture's MTP graph (asked for, it is priced as the
    second target that build runs)."""
    c = _choose(target, opts, files or LocalFiles(), build)
    if c.drafter is not None and c.explicit:
        _refuse_mismatch(target, c.drafter)
    return c


def _no_mtp_graph(target: ModelInfo, build: int) -> str | None:
    """Why an embedded NextN head drafts nothing on ``build`` (None: it has the architecture's MTP graph)."""
    if mtp_graph(build, target.arch):
        return None
    return (
        f"llama.cpp b{build} has no MTP graph for {target.arch} (from b{MTP_GRAPH_SINCE[target.arch]}): its MTP "
        "context runs the whole model again and drafts nothing the model predicted"
    )


def _asked_head(target: ModelInfo, build: int, ngram: str | None, asked: str) -> SpecChoice:
    """The embedded NextN head ``asked`` for: kept, and said where the build runs it as a second target."""
    said = (f"{asked} kept as asked: {why}",) if (why := _no_mtp_graph(target, build)) else ()
    return SpecChoice(Drafter("draft-mtp", None, target, "embedded"), ngram, True, said)


def _choose(target: ModelInfo, opts: SpecOptions, files: DrafterFiles, build: int) -> SpecChoice:
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
            return _asked_head(target, build, ngram, "--spec-type draft-mtp")
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
            return _asked_head(target, build, None, "--spec draft-mtp")
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
        if (why := _no_mtp_graph(target, build)) is None:
            return SpecChoice(Drafter("draft-mtp", None, target, "embedded"), None, False)
        notes.append(f"the NextN head is not drafted with: {why}")
    sidecars = files.sidecars(target.path)
    for kind, _ in SIDECARS:
        if kind in sidecars:
            d = _open_drafter(sidecars[kind], "sidecar", kind, files)
            if (why := mismatch(target, d)) is not None:
                notes.append(f"{kind} sidecar {os.path.basename(sidecars[kind])} passed over: {why}")
                continue
            return SpecChoice(d, None, False, tuple(notes))
    return SpecChoice(None, None, False, tuple(notes))
