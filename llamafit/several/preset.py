"""llama-server's router presets (``--models-preset FILE.ini``), read and written as b11434 does.

Mirrors ``common/preset.cpp``: ``[section]`` headers, ``key = value`` lines, ``;``/``#`` comments (a value
ends where whitespace and a comment start), a ``[*]`` section applied under every model's own, keys that
are any flag alias without its dashes or its ``LLAMA_ARG_*`` name, flag values read with llama.cpp's
truthy/falsey words, and the preset-only keys (``load-on-startup``, ``stop-timeout``,
``dedup-cache-models``). What ``parse_ini_from_file`` keeps (common/preset.cpp:170-248): a section header
starts its section anew (``parsed[section] = {}``: a second ``[a]`` drops the first's keys), a repeated key is
last-wins, and the keys are a ``std::map``, so a section's options are applied in the sorted order of the
keys as written: of ``ctx-size = 16384`` and ``c = 4096`` the router takes 16384 (``c`` sorts first).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llamafit.errors import UsageError
from llamafit.paths import read_regular_file
from llamafit.server.args import OPTIONS, Option, parse_server_args
from llamafit.server.values import FALSY, TRUTHY  # common_arg_utils::is_truthy, is_falsey

GLOBAL = "*"
PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
MAX_PRESET_BYTES = 1 << 20
_IDENT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.-]*")
_HEADER = re.compile(r"^[ \t]*\[[ \t]*([^\]]*?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KV = re.compile(r"^[ \t]*([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_BLANK = re.compile(r"^[ \t]*(?:[;#].*)?$")


def _keys() -> dict[str, Option]:
    out: dict[str, Option] = {}
    for opt in OPTIONS.values():
        if not opt.in_server:
            continue
        for a in (*opt.aliases, *opt.negated):
            out.setdefault(a.lstrip("-"), opt)
        if opt.env:
            out.setdefault(opt.env, opt)
    return out


_BY_KEY = _keys()


@dataclass(frozen=True)
class Section:
    name: str
    values: dict[str, str] = field(default_factory=dict)  # key as written -> value (last wins)
    repeated: list[int] = field(default_factory=list)  # lines of later headers of the same name (they won)


def read_ini(text: str, source: str = "preset") -> list[Section]:
    """The sections of a preset, in file order (llama.cpp's grammar: a line that is no header, key line,
    comment or blank line makes the whole file invalid)."""
    sections: dict[str, Section] = {}  # by name, in file order
    current: Section | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if _BLANK.match(line):
            continue
        if m := _HEADER.match(line):
            again = sections.get(m.group(1))
            if again is not None:  # llama.cpp starts the section over: the earlier header's keys are gone
                again.values.clear()
                again.repeated.append(n)
                current = again
            else:
                current = sections[m.group(1)] = Section(m.group(1))
            continue
        if m := _KV.match(line):
            if current is None:  # keys before any header belong to llama.cpp's default (unnamed) preset
                current = sections[""] = Section("")
            current.values[m.group(1)] = m.group(2)
            continue
        raise UsageError(f"{source}:{n}: not a preset line: {line[:80]!r}", hint="lines are [section] or key = value")
    return list(sections.values())


def load(path: str | Path) -> list[Section]:
    p = Path(path)
    data = read_regular_file(p, MAX_PRESET_BYTES + 1, "the preset")
    if len(data) > MAX_PRESET_BYTES:
        raise UsageError(f"{p} is larger than {MAX_PRESET_BYTES >> 20} MiB: not a preset")
    return read_ini(data.decode("utf-8", errors="replace"), str(p))


def renamed(sections: Sequence[Section]) -> list[str]:
    """What the router makes of the section names: a tag it renames, and sections it takes for one model
    (of which it keeps the later), each said once."""
    out: list[str] = []
    first: dict[str, str] = {}
    for s in sections:
        name = router_name(s.name)
        if name in first and first[name] != s.name:
            out.append(f"[{first[name]}] and [{s.name}] are one model for llama-server ({name}): the later is kept")
        elif name != s.name:
            out.append(f"[{s.name}] is {name} for llama-server's router (its quant tag made canonical)")
        first.setdefault(name, s.name)
    return out


def router_name(section: str) -> str:
    """The name llama-server's router gives a preset's section, the one its log and ``/models`` use: the
    quant tag after the last ``:`` made canonical (common/preset.cpp:20-35, 292-299): its last ``-``/``.``
    piece of letters, digits and ``_``, upper-cased (``repo:UD-Q4_K_XL`` is ``repo:Q4_K_XL``,
    ``qwen:latest`` is ``qwen:LATEST``); byte-wise, as std::toupper in the C locale."""
    if section in ("", GLOBAL):
        return section
    head, colon, tag = section.rpartition(":")
    if not colon:
        return section
    m = _TAG_END.search(tag)
    return f"{head}:{_upper(m.group(1) if m else tag)}"


_TAG_END = re.compile(r"[-.]([A-Z0-9_]+)\Z", re.IGNORECASE | re.ASCII)


def _upper(text: str) -> str:
    return "".join(c.upper() if "a" <= c <= "z" else c for c in text)


def to_tokens(values: dict[str, str], source: str) -> tuple[list[str], dict[str, str]]:
    """A section's keys as server flags (the long spelling), in the order llama.cpp applies them, and its
    preset-only keys."""
    tokens: list[str] = []
    only: dict[str, str] = {}
    for key, value in sorted(values.items()):  # llama.cpp's std::map order: of two aliases, the later wins
        if key == "version":
            continue
        if key in PRESET_ONLY:
            only[key] = value
            continue
        opt = _BY_KEY.get(key)
        if opt is None:
            raise UsageError(
                f"{source}: option {key!r} is not a llama-server option", hint="keys are flags without dashes"
            )
        negated_key = any(a.lstrip("-") == key for a in opt.negated)
        if opt.arity == 0:
            # a negated key's value turns into its opposite (parse_bool_arg, common/preset.cpp:268-276), then the
            # flag is on unless that is falsey (to_args, common/preset.cpp:53-64)
            on = flag_value(key, value, source, f"with this it would pass {opt.key}") != negated_key
            if on:
                tokens.append(opt.key)
            elif opt.negated:
                tokens.append(opt.negated[-1])
        else:
            tokens += [opt.key, value]
    return tokens, only


def flag_value(key: str, value: str, source: str, otherwise: str) -> bool:
    """An on/off value as the router reads it: exactly (common_arg_utils::is_truthy and is_falsey,
    common/arg.cpp:1337-1343). Any other word is refused, with ``otherwise``, what llama-server would make of it: a
    flag is on unless its value is falsey (a ``kv-offload = False`` keeps the cache on the GPU), a model loads on
    startup only when the value is truthy (a ``load-on-startup = True`` never does)."""
    v = value.strip()
    if v in TRUTHY or v in FALSY:
        return v in TRUTHY
    meant = "false" if v.lower() in FALSY else "true" if v.lower() in TRUTHY else "true or false"
    raise UsageError(
        f"{source}: {key} = {value}: llama-server reads only on, off, true, false, enabled, disabled, 1 and 0 (in "
        f"lower case) as a switch; {otherwise}",
        hint=f"write {key} = {meant}",
    )


def section_text(name: str, argv: Sequence[str], extra: Iterable[tuple[str, str]] = ()) -> str:
    """One section whose keys make llama-server's router start ``argv`` (after the binary): each option
    under its long name, once (the router keeps one value per option); an option given twice that
    accumulates is joined with commas, as llama.cpp's list options read it."""
    args = parse_server_args(list(argv))
    lines = [f"[{name}]"]
    seen: dict[str, int] = {}
    for o in args.items:
        if o.option is None:
            raise UsageError(f"{o.tokens[0]} is not an option this llama-server knows; a preset cannot carry it")
        key = o.option.key.lstrip("-")
        if o.option.arity == 0:
            value = "false" if o.negated else "true"
        elif len(o.values) == 1:
            value = o.values[0]
        else:
            raise UsageError(f"{o.tokens[0]} takes {len(o.values)} values; a preset holds one per option")
        if "\n" in value or "\r" in value:
            raise UsageError(f"the value of {o.tokens[0]} spans lines; a preset cannot carry it")
        if ";" in value or "#" in value or value != value.strip():
            # llama.cpp's preset grammar ends a value at ';' or '#' (a comment) and drops the spaces around it
            raise UsageError(
                f"the value of {o.tokens[0]} ({value!r}) has ';', '#' or outer spaces, which a preset cannot carry",
                hint="rename the file or folder, or run that model on its own",
            )
        if key in seen:
            if not o.option.accumulates:
                lines[seen[key]] = f"{key} = {value}"  # last wins, as on the command line
                continue
            lines[seen[key]] += "," + value
            continue
        seen[key] = len(lines)
        lines.append(f"{key} = {value}")
    lines += [f"{k} = {v}" for k, v in extra]
    return "\n".join(lines) + "\n"
