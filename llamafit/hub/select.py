"""Which files of a Hub repo llama-server's ``-hf`` would use, decided exactly as llama.cpp b11434 does.

Mirrors ``common/download.cpp:464-766`` (docs/server-cli.md §4): the ``owner/repo[:QUANT]``
split, the repo-id check (``common/hf-cache.cpp:117-141``), ``find_best_model`` (the tag as a
case-insensitive regex followed by ``[.-]``; no tag tries Q4_K_M then Q8_0, then the first model
file; only first shards), split sets kept together, and ``find_best_sibling`` for the projector and
the drafter sidecars (deepest shared directory, exact tag, closest quant bits, listing order).
Pure functions over the listing, in listing order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from llamafit.errors import UsageError
from llamafit.gguf.naming import SIDECARS, quant_bits, split_info, tag_bits

NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True)
class HubFile:
    path: str  # repo-relative
    size: int
    oid: str | None = None  # LFS sha256, else the git blob id


def is_valid_repo_id(repo: str) -> bool:
    """``[A-Za-z0-9_]`` runs separated by single ``/ . -``, exactly one ``/``, at most 256 characters."""
    if not repo or len(repo) > 256:
        return False
    slash, special = 0, True
    for c in repo:
        if c.isascii() and (c.isalnum() or c == "_"):
            special = False
        elif c in "/.-":
            if special:
                return False
            slash += c == "/"
            special = True
        else:
            return False
    return not special and slash == 1


def is_safe_repo_path(path: str) -> bool:
    """A repo-relative POSIX path that stays inside the repo's snapshot: no absolute path, no ``.``
    or ``..`` or empty part, no backslash (a separator on Windows) and no control character."""
    if not path or len(path) > 1024 or path.startswith("/") or "\\" in path:
        return False
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def split_repo_tag(ref: str) -> tuple[str, str]:
    """``owner/repo[:QUANT]`` -> (repo, tag), as common_download_split_repo_tag: the tag is the last
    ``:`` piece, the repo the first."""
    parts = ref.split(":")
    repo, tag = parts[0], parts[-1] if len(parts) > 1 else ""
    if not is_valid_repo_id(repo):
        raise UsageError(
            f"{ref!r} is neither a file nor a Hugging Face repo",
            hint="give a GGUF path, or owner/repo[:QUANT] such as Qwen/Qwen3-8B-GGUF:Q4_K_M",
        )
    return repo, tag


def is_model_file(path: str) -> bool:
    base = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(k in base for k in NOT_MODELS)


def _tag_regex(tag: str) -> re.Pattern[str]:
    try:
        # llama.cpp uses the tag unescaped as a regex (std::regex, icase)
        return re.compile(tag + "[.-]", re.IGNORECASE)
    except re.error as e:
        raise UsageError(f"quant tag {tag!r} is not usable: {e}", hint="write the quant as in the file name") from None


def is_first_shard(f: HubFile) -> bool:
    info = split_info(f.path)
    return info is None or info.count <= 1 or info.index == 1


def find_best_model(files: Sequence[HubFile], tag: str) -> HubFile | None:
    for t in (tag,) if tag else DEFAULT_TAGS:
        pat = _tag_regex(t)
        for f in files:
            if is_model_file(f.path) and pat.search(f.path) and is_first_shard(f):
                return f
    if not tag:
        return next((f for f in files if is_model_file(f.path) and is_first_shard(f)), None)
    return None


def split_files(files: Sequence[HubFile], primary: HubFile) -> list[HubFile]:
    """Every listed shard of ``primary``'s set (same prefix, same count), in listing order."""
    info = split_info(primary.path)
    if info is None or info.count <= 1:
        return [primary]
    out = []
    for f in files:
        fi = split_info(f.path)
        if fi is not None and fi.count == info.count and fi.prefix == info.prefix:
            out.append(f)
    return out


def missing_shards(shards: Sequence[HubFile]) -> list[int]:
    """Indices 1..N absent from a split set's listing (a partial upload, or a listing cut short)."""
    infos = [split_info(f.path) for f in shards]
    count = max((i.count for i in infos if i), default=1)
    have = {i.index for i in infos if i}
    return [k for k in range(1, count + 1) if k not in have]


def find_best_sibling(files: Sequence[HubFile], model: str, keyword: str, tag: str = "") -> HubFile | None:
    """The sidecar (``mmproj``, ``mtp-``, ...) that goes with ``model`` (download.cpp:531-624)."""
    tag_upper = tag.upper()
    model_bits = tag_bits(tag_upper) if tag_upper else quant_bits(model)
    model_dir = model.split("/")[:-1]
    best: HubFile | None = None
    best_depth = best_diff = 0
    best_exact = False
    for f in files:
        if not f.path.endswith(".gguf") or keyword not in f.path:
            continue
        sib_dir = f.path.split("/")[:-1]
        if len(sib_dir) > len(model_dir) or model_dir[: len(sib_dir)] != sib_dir:
            continue  # the sidecar must sit in the model's directory or one above it
        depth = len(sib_dir)
        diff = abs(quant_bits(f.path) - model_bits)
        exact = bool(tag_upper) and f"-{tag_upper}." in f.path.upper()
        if (
            best is None
            or depth > best_depth
            or (depth == best_depth and exact and not best_exact)
            or (depth == best_depth and exact == best_exact and diff < best_diff)
        ):
            best, best_depth, best_diff, best_exact = f, depth, diff, exact
    return best


@dataclass(frozen=True)
class Selection:
    """What llama-server would fetch for one ``-hf`` reference."""

    repo: str
    tag: str
    primary: HubFile | None
    model_files: tuple[HubFile, ...]
    mmproj: HubFile | None = None
    sidecars: dict[str, HubFile] = field(default_factory=dict)  # drafter kind -> file


def select(
    files: Sequence[HubFile],
    repo: str,
    tag: str = "",
    hf_file: str | None = None,
    *,
    mmproj: bool = True,
    sidecar_kinds: Sequence[str] = (),
) -> Selection:
    """common_download_get_hf_plan over a listing. Sidecar kinds are looked for with the tag; the
    projector by the closest quant bits to the chosen model."""
    primary = next((f for f in files if f.path == hf_file), None) if hf_file else find_best_model(files, tag)
    model_files = tuple(split_files(files, primary)) if primary else ()
    anchor = primary.path if primary else ""
    mm = find_best_sibling(files, anchor, "mmproj") if mmproj and primary else None
    side: dict[str, HubFile] = {}
    for kind, keyword in SIDECARS:
        if kind in sidecar_kinds and (f := find_best_sibling(files, anchor, keyword, tag)) is not None:
            side[kind] = f
    return Selection(repo, tag, primary, model_files, mm, side)


def gguf_names(files: Sequence[HubFile]) -> list[str]:
    return [f.path for f in files if f.path.endswith(".gguf")]


def quants(files: Sequence[HubFile]) -> list[str]:
    """The quant tags of the repo's model files, in listing order, for "unknown quant" messages."""
    out: list[str] = []
    for f in files:
        info = split_info(f.path)
        if info and info.tag and is_model_file(f.path) and info.tag not in out:
            out.append(info.tag)
    return out
