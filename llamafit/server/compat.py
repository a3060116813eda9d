"""Make an argv fit the binary that will run it: renamed flags translated, unknown planned flags dropped.

The flags a binary accepts come from its own ``--completion-bash`` (``llamafit.server.capabilities``), not
from a version number. Renames known across llama.cpp builds (docs/server-cli.md §3.2):

* ``--draft``/``--draft-n``/``--draft-max`` <-> ``--spec-draft-n-max``; ``--draft-min`` <-> ``--spec-draft-n-min``
* ``--no-mmap`` -> ``-lm none``; ``--mlock`` -> ``-lm mlock`` (removed in b11434)
* a bare ``-fa`` (older builds took no value) -> ``-fa on``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamafit.server.args import Planned, lookup
from llamafit.server.capabilities import Capabilities

# old spelling -> (new spelling, extra tokens the new one needs)
_RENAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "--draft": ("--spec-draft-n-max", ()),
    "--draft-n": ("--spec-draft-n-max", ()),
    "--draft-max": ("--spec-draft-n-max", ()),
    "--draft-min": ("--spec-draft-n-min", ()),
    "--draft-n-min": ("--spec-draft-n-min", ()),
    "--no-mmap": ("-lm", ("none",)),
    "--mlock": ("-lm", ("mlock",)),
}
_REVERSE = {"--spec-draft-n-max": "--draft-max", "--spec-draft-n-min": "--draft-min"}


@dataclass(frozen=True)
class Translated:
    args: list[str]
    notes: tuple[str, ...]


def normalize_bare_flash_attn(argv: Sequence[str]) -> list[str]:
    """``-fa`` with no value (the old spelling) becomes ``-fa on`` before parsing."""
    out: list[str] = []
    for i, tok in enumerate(argv):
        out.append(tok)
        hit = lookup(tok)
        if hit and hit[0].key == "--flash-attn":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or (nxt.startswith("-") and nxt != "-1"):
                out.append("on")
    return out


def translate_user_args(argv: Sequence[str], caps: Capabilities) -> Translated:
    """Rewrite the user's extra args for this binary. Flags it does not know are left for it to refuse
    (a user's flag is never silently dropped); renamed ones are spelled the way it expects."""
    out: list[str] = []
    notes: list[str] = []
    toks = normalize_bare_flash_attn(argv)
    if toks != list(argv):
        notes.append("bare -fa written as -fa on (this build needs a value)")
    i = 0
    while i < len(toks):
        tok = toks[i]
        norm = tok.replace("_", "-") if tok.startswith("--") else tok
        if not caps.accepts(norm) and norm in _RENAMES:  # unknown here, or a "has been removed" stub
            new, extra = _RENAMES[norm]
            if caps.accepts(new):
                has_value = new not in ("-lm",) and i + 1 < len(toks)
                out += [new, *extra]
                if has_value:
                    out.append(toks[i + 1])
                    i += 1
                notes.append(f"{tok} is spelled {new}{' ' + ' '.join(extra) if extra else ''} in this build")
                i += 1
                continue
        if not caps.accepts(norm) and norm in _REVERSE and caps.accepts(_REVERSE[norm]):
            out.append(_REVERSE[norm])
            notes.append(f"{tok} is spelled {_REVERSE[norm]} in this build")
            i += 1
            continue
        out.append(tok)
        i += 1
    return Translated(out, tuple(notes))


def supported(planned: Sequence[Planned], caps: Capabilities) -> tuple[list[Planned], tuple[str, ...]]:
    """Planned flags this binary does not accept are left out (with a note), never emitted;
    a renamed one is spelled the old way when only that is known."""
    out: list[Planned] = []
    notes = []
    for p in planned:
        if p.family == "overrides" and "--n-cpu-ffn" in p.tokens and not caps.accepts("--n-cpu-ffn"):
            p = _ffn_as_overrides(p)  # a build before --n-cpu-ffn places the same weights with -ot
        flag = p.tokens[0]
        hit = lookup(flag)
        key = hit[0].key if hit else flag
        if caps.accepts(flag):
            out.append(p)
        elif key in _REVERSE and caps.accepts(_REVERSE[key]):
            out.append(Planned(p.family, (_REVERSE[key], *p.tokens[1:])))
        else:
            notes.append(f"this llama-server does not accept {flag}; llamafit left it out")
    return out, tuple(notes)


def _ffn_as_overrides(p: Planned) -> Planned:
    """``--n-cpu-ffn N`` written as the ``-ot`` entries it stands for (common/arg.cpp:2779-2789: the first N layers'
    ``\\.ffn_(up|down|gate)\\.`` on the CPU), joined with the plan's other ``-ot`` entries."""
    words = list(p.tokens)
    i = words.index("--n-cpu-ffn")
    n = int(words[i + 1])
    del words[i : i + 2]
    entries = [rf"blk\.{k}\.ffn_(up|down|gate)\.=CPU" for k in range(n)]
    if "-ot" in words:
        j = words.index("-ot")
        entries.append(words[j + 1])
        del words[j : j + 2]
    return Planned(p.family, (*words, "-ot", ",".join(entries)))
