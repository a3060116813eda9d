"""Speculative decoding: which drafter, what it costs, and what the target pays for it.

Kinds and their memory (reference §5, ``common/speculative.cpp:2527-2650``):

* ``draft-simple``: a separate small model (``-md``). Its weights with its own ``-ngld``/``-devd``/
  ``-otd``, the target's tensor split; its KV at the *target's* n_ctx with ``-ctkd/-ctvd`` (f16
  unless set, never ``-ctk``); its compute and output buffers; the same slots and KV unification.
* ``draft-mtp``: the NextN blocks of the target (loaded only with MTP on) or an ``mtp-`` sidecar. An
  MTP context over the NextN layers (KV + compute; the weights are the target's), and the target's
  recurrent state grows to ``rs_size x (1 + n_rs_seq)`` rows on rollback architectures.
* ``draft-eagle3`` / ``draft-dflash`` / ``draft-dspark``: sidecar weights, their KV and compute, the
  target's hidden-state extraction buffers, and the same rollback rows.
* ``ngram-*``: no device memory; host structures (ngram-mod 16 MiB) and a larger verification batch.

Detection follows ``common_speculative_types_from_gguf`` (``speculative.cpp:2351-2386``). Nothing
here prints; decisions come back as data for the fit to record.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Protocol

from llamafit.argv import ServerArgs
from llamafit.errors import LlamafitError, UsageError
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.placement import Override
from llamafit.request import FFN_EXPS_REGEX, _int
from llamafit.units import MiB

SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
    "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)  # fmt: skip
DRAFT_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
ROLLBACK_TYPES = frozenset({"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"})  # common.h:399-405
NGRAM_TYPES = frozenset({"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"})
# Sidecar file keywords, in llama.cpp's priority when a draft repo has several (arg.cpp:546-565)
SIDECAR_KEYWORDS = (("draft-mtp", "mtp-"), ("draft-dspark", "dspark-"), ("draft-dflash", "dflash-"),
                    ("draft-eagle3", "eagle3-"))  # fmt: skip
DEFAULT_N_MAX = 3  # --spec-draft-n-max (common.h:329)
# Verification depth per ngram type (common_speculative_n_max, speculative.cpp:2396-2430)
NGRAM_N_MAX = {"ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48, "ngram-mod": 64, "ngram-cache": 8}
# The seed's flat reserve for a drafter whose size cannot be known: 5 % of the card plus a draft graph.
UNSIZED_FRACTION = 0.05
DRAFT_GRAPH_RESERVE = 224 * MiB
DEFAULT_CTX_CHECKPOINTS = 32  # -ctxcp (common.h:635)
DEFAULT_CACHE_RAM_MIB = 8192  # -cram (common.h:638)


def ngram_host_bytes(spec_type: str, n_parallel: int) -> int:
    """Host structures of the ngram implementations (reference §5.3 table)."""
    if spec_type == "ngram-mod":
        return 4 * (1 << 20) * 4  # one shared pool of 4 Mi int32 (ngram-mod.cpp:9-10)
    if spec_type == "ngram-simple":
        return 1 << 20  # one 2^18 x 4 B key map (ngram-map.h:42)
    if spec_type in ("ngram-map-k", "ngram-map-k4v"):
        return n_parallel << 20
    return 0  # ngram-cache grows at run time


def detect_kind(model: ModelInfo) -> str | None:
    """The type llama.cpp infers from a draft GGUF; None for a plain model (needs draft-simple)."""
    if model.arch == "dflash":
        return "draft-dspark" if model.has_tensor("markov_w1.weight") else "draft-dflash"
    if model.arch == "eagle3":
        return "draft-eagle3"  # llama.cpp never infers it (preset.cpp:371); llamafit says it explicitly
    n = model.hparams.n_layer_all
    if model.has_tensor(f"blk.{n - 1}.nextn.eh_proj.weight"):
        return "draft-mtp"
    return None


def has_embedded_mtp(model: ModelInfo) -> bool:
    return model.hparams.n_nextn > 0 and detect_kind(model) == "draft-mtp" and model.hparams.n_layer > 0


_QUANT_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def _quant_bits(name: str) -> int | None:
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", name[:-5] if name.endswith(".gguf") else name)
    m = _QUANT_RE.search(stem)
    if not m:
        return None
    d = re.search(r"\d+", m.group(1))
    return int(d.group()) if d else None


def find_sidecars(model_path: str) -> dict[str, str]:
    """Drafter sidecars beside a local model, by kind: files named like llama.cpp's find_best_sibling
    looks for them (``mtp-``, ``dspark-``, ``dflash-``, ``eagle3-``; case-sensitive), the closest quant
    bits to the model winning (common/download.cpp:531-624)."""
    directory = os.path.dirname(os.path.abspath(model_path))
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    ref = _quant_bits(os.path.basename(model_path))
    out: dict[str, str] = {}
    for kind, keyword in SIDECAR_KEYWORDS:
        cands = [n for n in names if n.endswith(".gguf") and keyword in n and "mmproj" not in n]
        cands = [n for n in cands if not re.search(r"-0000[2-9]-of-|-000[1-9]\d-of-", n)]  # first shards only
        if not cands:
            continue

        def rank(n: str) -> int:
            b = _quant_bits(n)
            return abs(b - ref) if b is not None and ref is not None else 99

        best = min(cands, key=rank)
        out[kind] = os.path.join(directory, best)
    return out


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
        return os.path.exists(path)

    def size(self, path: str) -> int | None:
        try:
            return os.path.getsize(path)
        except OSError:
            return None

    def open(self, path: str) -> ModelInfo:
        return load_model(path)


@dataclass(frozen=True)
class SpecOptions:
    """Speculative settings from llamafit's options and the user's extra args."""

    mode: str = "auto"  # auto | off | one of SPEC_TYPES
    prefer: str = "context"  # context | speed
    draft: str | None = None  # --draft
    user_types: tuple[str, ...] = ()  # --spec-type / --spec-default in the extra args (explicit)
    user_draft: str | None = None  # -md in the extra args (last wins)
    user_draft_hf: str | None = None  # -hfd in the extra args
    n_max: int = DEFAULT_N_MAX
    ngl: int = -1  # -ngld
    devices: tuple[str, ...] | None = None  # -devd (() = none)
    overrides: tuple[Override, ...] = ()  # -otd / -cmoed / -ncmoed
    type_k: str = "f16"  # -ctkd
    type_v: str = "f16"  # -ctvd
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB
    ngram_mod_n_max: int = 64

    @property
    def explicit(self) -> bool:
        return bool(self.user_types or self.user_draft or self.user_draft_hf or self.draft) or self.mode not in (
            "auto",
            "off",
        )


def spec_options(
    args: ServerArgs, *, mode: str = "auto", prefer: str = "context", draft: str | None = None
) -> SpecOptions:
    from llamafit.request import _kv_type

    if mode not in ("auto", "off", *SPEC_TYPES[1:]):
        raise UsageError(f"--spec {mode!r} is not a speculative type", hint="auto, off, " + ", ".join(SPEC_TYPES[1:]))
    if prefer not in ("context", "speed"):
        raise UsageError(f"--prefer {prefer!r}: expected context or speed")
    types: list[str] = []
    for o in args.items:
        if o.key == "--spec-type":
            for t in (o.value or "").split(","):
                if t not in SPEC_TYPES:
                    raise UsageError(f"--spec-type: unknown speculative type {t!r}", hint=", ".join(SPEC_TYPES))
                types.append(t)
        elif o.key == "--spec-default":
            types.append("ngram-mod")
    # a "none" in one value makes that value {none}, but cannot remove earlier types (reference §3.1)
    kw: dict[str, object] = {}
    if (occ := args.last("--spec-draft-model")) is not None:
        kw["user_draft"] = occ.value
    if (occ := args.last("--spec-draft-hf")) is not None:
        kw["user_draft_hf"] = occ.value
    if (occ := args.last("--spec-draft-n-max")) is not None:
        kw["n_max"] = _int(occ.value, occ.tokens[0], 0)
    if (occ := args.last("--spec-draft-ngl")) is not None:
        v = (occ.value or "").strip().lower()
        kw["ngl"] = -1 if v in ("auto", "all") else _int(occ.value, occ.tokens[0], -2)
    if (occ := args.last("--spec-draft-device")) is not None:
        names = [d.strip().upper() for d in (occ.value or "").split(",") if d.strip()]
        kw["devices"] = () if names == ["NONE"] else tuple(names)
    ov: list[Override] = []
    for o in args.items:
        if o.key == "--spec-draft-override-tensor":
            for entry in (o.value or "").split(","):
                pat, sep, buft = entry.partition("=")
                if sep:
                    ov.append(Override(pat, buft))
        elif o.key == "--spec-draft-cpu-moe":
            ov.append(Override(FFN_EXPS_REGEX, "CPU"))
        elif o.key == "--spec-draft-n-cpu-moe":
            ov += [Override(rf"blk\.{i}{FFN_EXPS_REGEX}", "CPU") for i in range(_int(o.value, o.tokens[0], 0))]
    kw["overrides"] = tuple(ov)
    if (occ := args.last("--spec-draft-type-k")) is not None:
        kw["type_k"] = _kv_type(occ.value, occ.tokens[0])
    if (occ := args.last("--spec-draft-type-v")) is not None:
        kw["type_v"] = _kv_type(occ.value, occ.tokens[0])
    if (occ := args.last("--ctx-checkpoints")) is not None:
        kw["ctx_checkpoints"] = _int(occ.value, occ.tokens[0], 0)
    if (occ := args.last("--cache-ram")) is not None:
        kw["cache_ram_mib"] = _int(occ.value, occ.tokens[0], -1)
    if (occ := args.last("--spec-ngram-mod-n-max")) is not None:
        kw["ngram_mod_n_max"] = _int(occ.value, occ.tokens[0], 0)
    return SpecOptions(mode=mode, prefer=prefer, draft=draft, user_types=tuple(types), **kw)  # type: ignore[arg-type]


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
    from llamafit.errors import AccessError, ModelNotFoundError, NetworkError

    if not files.exists(path):
        raise ModelNotFoundError(f"drafter not found: {path}", hint="check the --draft / -md path")
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
    for kind, _ in SIDECAR_KEYWORDS:
        if kind in sidecars:
            return SpecChoice(_open_drafter(sidecars[kind], "sidecar", kind, files), None, False)
    return SpecChoice(None, None, False)


def n_draft_max(kinds: set[str], opts: SpecOptions) -> int:
    """common_speculative_n_max over the active types: the verification depth of the target."""
    n = 0
    for k in kinds:
        if k in DRAFT_TYPES:
            n = max(n, opts.n_max)
        elif k == "ngram-mod":
            n = max(n, opts.ngram_mod_n_max)
        elif k in NGRAM_N_MAX:
            n = max(n, NGRAM_N_MAX[k])
    return n
