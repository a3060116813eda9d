"""Speculative decoding: which drafter, what it costs, and what the target pays for it.

Kinds and their memory (docs/memory-model.md §5, ``common/speculative.cpp:2527-2650``):

* ``draft-simple``: a separate small model (``-md``). Its weights with its own ``-ngld``/``-devd``/
  ``-otd``, the target's tensor split; its KV at the *target's* n_ctx with ``-ctkd/-ctvd`` (f16
  unless set, never ``-ctk``); its compute and output buffers; the same slots and KV unification.
* ``draft-mtp``: the NextN blocks of the target (loaded only with MTP on) or an ``mtp-`` sidecar. An
  MTP context over the NextN layers (KV + compute; the weights are the target's), and the target's
  recurrent state grows to ``rs_size x (1 + n_rs_seq)`` rows on rollback architectures.
* ``draft-eagle3`` / ``draft-dflash`` / ``draft-dspark``: sidecar weights, their KV and compute, the
  target's hidden-state extraction buffers, and the same rollback rows.
* ``ngram-*``: no weights; host structures (ngram-mod 16 MiB) and a larger verification batch (more
  output rows, a larger compute graph on the devices).

Detection follows ``common_speculative_types_from_gguf`` (``speculative.cpp:2351-2386``). Nothing
here prints; decisions come back as data for the fit to record.

Modules:

* ``kinds``: the speculative types, their constants, a drafter's kind told from its file;
* ``choose``: which drafter the options ask for, before memory is considered;
* ``cost``: the drafter's footprint per device, and what the target pays;
* ``flags``: llamafit's speculative options joined with the drafter flags of the extra args.
"""

from llamafit.speculative.choose import Drafter, DrafterFiles, LocalFiles, SpecChoice, choose
from llamafit.speculative.cost import SpecConfig, drafter_use, n_draft_max, rollback_rows, target_settings
from llamafit.speculative.flags import SpecOptions, spec_options
from llamafit.speculative.kinds import (
    DEFAULT_N_MAX,
    DRAFT_GRAPH_RESERVE,
    DRAFT_TYPES,
    NGRAM_N_MAX,
    NGRAM_TYPES,
    ROLLBACK_TYPES,
    SPEC_TYPES,
    UNSIZED_FRACTION,
    detect_kind,
    find_sidecars,
    has_embedded_mtp,
    ngram_host_bytes,
)

__all__ = [
    "DEFAULT_N_MAX",
    "DRAFT_GRAPH_RESERVE",
    "DRAFT_TYPES",
    "NGRAM_N_MAX",
    "NGRAM_TYPES",
    "ROLLBACK_TYPES",
    "SPEC_TYPES",
    "UNSIZED_FRACTION",
    "Drafter",
    "DrafterFiles",
    "LocalFiles",
    "SpecChoice",
    "SpecConfig",
    "SpecOptions",
    "choose",
    "detect_kind",
    "drafter_use",
    "find_sidecars",
    "has_embedded_mtp",
    "n_draft_max",
    "ngram_host_bytes",
    "rollback_rows",
    "spec_options",
    "target_settings",
]
