"""The resolving stage: the model a plan is for (a local GGUF, or a Hub repo's from its headers alone), as the
loader will read it (``--override-kv`` applied, what llama-server would refuse refused now), with its
projector and the LoRA adapters and control vectors the server will load."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from llamafit.errors import UsageError
from llamafit.gguf.checks import check_model
from llamafit.gguf.mmproj import Projector, read_projector
from llamafit.gguf.model import ModelInfo, load_model, with_kv
from llamafit.hub.resolve import Hub, is_hub_ref
from llamafit.memory.adapters import Adapters, read_adapters
from llamafit.options import Options
from llamafit.planning.asked import Asked
from llamafit.planning.discover import new_hub
from llamafit.server.args import ServerArgs
from llamafit.server.values import kv_overrides


@dataclass(frozen=True)
class Resolved:
    """The model a plan is for, what it loads beside it, and the request (its projector's path filled in)."""

    model: ModelInfo
    asked: Asked
    projector: Projector | None = None
    adapters: Adapters | None = None


def resolve(ref: str, o: Options, asked: Asked, hub: Hub, model: ModelInfo | None = None) -> Resolved:
    """The model ``ref`` names (``model``: its header, already read), as the server will load it."""
    req = asked.req
    notes = list(asked.notes)
    projector = read_projector(req.mmproj) if req.mmproj else None
    local = os.path.exists(ref) or not is_hub_ref(ref)
    if local and (o.hf_file or o.revision):
        raise UsageError("--hf-file and --revision apply to a Hub repo, not to a local file")
    if model is not None:
        info = model
    elif not local:
        auto_mm = req.mmproj_auto and not req.mmproj and not req.mmproj_url
        hm = hub.resolve_model(ref, hf_file=o.hf_file, revision=o.revision, mmproj=auto_mm)
        info = hm.model
        if hm.mmproj is not None:
            projector = hm.mmproj
            req = replace(req, mmproj=hm.mmproj.path)
    else:
        info = load_model(ref)
    # --override-kv changes what the loader reads: the memory model reads the same keys
    if overrides := kv_overrides(asked.user):
        info, kv_notes = with_kv(info, overrides)
        notes += kv_notes
    # what llama-server would refuse or abort on, before a plan calls it fitting
    check_model(info.kv, info.hparams, (t.name for t in info.tensors), info.path)
    asked = replace(asked, req=req, notes=tuple(notes))
    return Resolved(info, asked, projector, adapters_of(asked.user, info))


def adapters_of(user: ServerArgs, info: ModelInfo) -> Adapters | None:
    """The LoRA adapters and control vectors the server will load (--lora, --lora-scaled FNAME:SCALE, and the
    same for control vectors; comma-separated, every occurrence), priced from their headers."""

    def files(key: str, scaled: bool) -> list[str]:
        out = []
        for occ in user.all(key):
            for item in (x for x in (occ.value or "").split(",") if x):
                out.append(item.rsplit(":", 1)[0] if scaled else item)
        return out

    lora = files("--lora", False) + files("--lora-scaled", True)
    cvec = files("--control-vector", False) + files("--control-vector-scaled", True)
    return read_adapters(lora, cvec, info.hparams.n_embd) if lora or cvec else None


def load_any_model(
    ref: str, *, hf_file: str | None = None, revision: str | None = None, offline: bool = False
) -> ModelInfo:
    """A local GGUF, or a Hub repo's model (its headers only), for ``inspect``."""
    if not os.path.exists(ref) and is_hub_ref(ref):
        hub = new_hub(offline)
        return hub.resolve_model(ref, hf_file=hf_file, revision=revision, mmproj=False).model
    if hf_file or revision:
        raise UsageError("--hf-file and --revision apply to a Hub repo, not to a local file")
    return load_model(ref)
