"""llama-server's command line: one option table for parsing the user's extra args and composing ours.

The table (``llamafit.server.option_table``) is generated from llama.cpp's ``common/arg.cpp``: every alias,
negated alias, arity and env name. Tokens are matched the way llama.cpp matches them (exact, with
``_`` -> ``-`` for ``--`` tokens only, no ``--flag=value``; docs/server-cli.md §1.2). Repeats follow
docs/server-cli.md §1.3: most options are last-wins, a few accumulate.

The user wins per option *family* by removal: when the extra args set any member of a family, the
planned occurrence of that family is dropped rather than overridden by appending a duplicate (which
would trigger llama.cpp's DEPRECATED warning, or worse, accumulate).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llamafit.errors import UsageError
from llamafit.server.option_table import ROWS


@dataclass(frozen=True)
class Option:
    key: str
    aliases: tuple[str, ...]
    negated: tuple[str, ...]
    arity: int
    accumulates: bool
    env: str | None
    in_server: bool


def _build() -> tuple[dict[str, Option], dict[str, tuple[Option, bool]]]:
    table: dict[str, Option] = {}
    tokens: dict[str, tuple[Option, bool]] = {}
    for key, aliases, neg, arity, acc, env, examples, excludes in ROWS:
        in_server = ("server" in examples or "common" in examples) and "server" not in excludes
        opt = Option(key, aliases, neg, arity, acc, env, in_server)
        table.setdefault(key, opt)
        for a in aliases:
            tokens.setdefault(a, (opt, False))
        for a in neg:
            tokens.setdefault(a, (opt, True))
    return table, tokens


OPTIONS, _TOKENS = _build()

# Option families: setting any member in the extra args suppresses everything llamafit planned for
# the family (docs/server-cli.md, launcher checklist 4-6).
FAMILIES: dict[str, frozenset[str]] = {
    "model": frozenset({"--model", "--hf-repo", "--hf-file", "--model-url", "--docker-repo"}),
    "ctx": frozenset({"--ctx-size"}),
    "parallel": frozenset({"--parallel"}),
    "kv-unified": frozenset({"--kv-unified"}),
    "ngl": frozenset({"--gpu-layers"}),
    "split": frozenset({"--tensor-split"}),
    "split-mode": frozenset({"--split-mode"}),
    "device": frozenset({"--device"}),
    "overrides": frozenset({"--override-tensor", "--cpu-moe", "--n-cpu-moe", "--n-cpu-ffn"}),
    "fit": frozenset({"--fit"}),
    "fit-target": frozenset({"--fit-target"}),
    "fit-ctx": frozenset({"--fit-ctx"}),
    "flash-attn": frozenset({"--flash-attn"}),
    "cache-type-k": frozenset({"--cache-type-k"}),
    "cache-type-v": frozenset({"--cache-type-v"}),
    "spec-type": frozenset({"--spec-type", "--spec-default"}),
    "draft-model": frozenset({"--spec-draft-model", "--spec-draft-hf"}),
    "draft-ngl": frozenset({"--spec-draft-ngl"}),
    "draft-device": frozenset({"--spec-draft-device"}),
    "draft-overrides": frozenset({"--spec-draft-override-tensor", "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe"}),
    "host": frozenset({"--host"}),
    "port": frozenset({"--port"}),
    "verbosity": frozenset({"--verbosity", "--verbose", "--log-disable"}),
    "mmproj": frozenset({"--mmproj", "--mmproj-url", "--mmproj-auto"}),
    "warmup": frozenset({"--warmup"}),
    "batch": frozenset({"--batch-size"}),
    "ubatch": frozenset({"--ubatch-size"}),
    "ctx-checkpoints": frozenset({"--ctx-checkpoints"}),
    "cache-ram": frozenset({"--cache-ram"}),
}
_FAMILY_OF: dict[str, str] = {k: fam for fam, keys in FAMILIES.items() for k in keys}


def normalize(token: str) -> str:
    """llama.cpp replaces ``_`` with ``-`` in ``--`` tokens only (common/arg.cpp:823-828)."""
    return token.replace("_", "-") if token.startswith("--") else token


def lookup(token: str) -> tuple[Option, bool] | None:
    return _TOKENS.get(normalize(token))


SECRET_OPTIONS = frozenset({"--api-key", "--hf-token"})  # options whose value is a key or a token
REDACTED = "<redacted>"


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret options (``--api-key``, ``--hf-token``, by any alias) replaced: what
    is shown, logged or kept of a command line others may read (an events file, a journal, the history)."""
    out = list(argv)
    for i, token in enumerate(out[:-1]):
        hit = lookup(token) if token.startswith("-") else None
        if hit is not None and hit[0].key in SECRET_OPTIONS and not hit[1]:
            out[i + 1] = REDACTED
    return out


@dataclass(frozen=True)
class Occurrence:
    tokens: tuple[str, ...]  # exactly as the user typed them (flag, then values)
    option: Option | None  # None for a flag this table does not know
    negated: bool = False

    @property
    def key(self) -> str | None:
        return self.option.key if self.option else None

    @property
    def values(self) -> tuple[str, ...]:
        return self.tokens[1:]

    @property
    def value(self) -> str | None:
        return self.tokens[1] if len(self.tokens) > 1 else None


@dataclass(frozen=True)
class ServerArgs:
    """The user's extra args, parsed; order preserved."""

    items: tuple[Occurrence, ...] = ()

    def all(self, key: str) -> list[Occurrence]:
        return [o for o in self.items if o.key == key]

    def last(self, key: str) -> Occurrence | None:
        found = self.all(key)
        return found[-1] if found else None

    def has(self, key: str) -> bool:
        return any(o.key == key for o in self.items)

    def sets_family(self, family: str) -> bool:
        keys = FAMILIES[family]
        return any(o.key in keys for o in self.items)

    def flag(self, key: str) -> bool | None:
        """Last state of a flag or flag pair: True, False (negated alias), or None when absent."""
        o = self.last(key)
        if o is None:
            return None
        return not o.negated

    def tokens(self) -> list[str]:
        return [t for o in self.items for t in o.tokens]

    def without(self, keys: Iterable[str]) -> ServerArgs:
        drop = set(keys)
        return ServerArgs(tuple(o for o in self.items if o.key not in drop))


def parse_server_args(argv: Sequence[str]) -> ServerArgs:
    """Split extra args into occurrences with the option table's arities.

    ``--flag=value`` is rejected with a hint (llama-server reads it as an unknown flag). Unknown
    flags pass through; the next token is taken as their value unless it looks like a flag.
    """
    items: list[Occurrence] = []
    i = 0
    args = list(argv)
    while i < len(args):
        tok = args[i]
        hit = lookup(tok)
        if hit is None and tok.startswith("-") and "=" in tok:
            flag, _, val = tok.partition("=")
            if lookup(flag) is not None:
                raise UsageError(
                    f"llama-server does not accept {tok!r}",
                    hint=f"write the value as its own argument: {shlex.join([flag, val])}",
                )
        if hit is None:
            if tok.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
                items.append(Occurrence((tok, args[i + 1]), None))
                i += 2
            else:
                items.append(Occurrence((tok,), None))
                i += 1
            continue
        opt, neg = hit
        n = 0 if neg else opt.arity
        if n > 0 and i + n > len(args) - 1:
            raise UsageError(
                f"{tok} expects {n} value{'s' if n > 1 else ''}",
                hint=f"e.g. {tok} {'N' if n == 1 else 'A B'}",
            )
        items.append(Occurrence(tuple(args[i : i + 1 + n]), opt, neg))
        i += 1 + n
    return ServerArgs(tuple(items))


@dataclass(frozen=True)
class Planned:
    """An option llamafit wants on the command line, with the family the user can override it by."""

    family: str
    tokens: tuple[str, ...]


def compose(binary: str, planned: Sequence[Planned], user: ServerArgs) -> list[str]:
    """The final argv: planned options whose family the user did not set, then the user's args."""
    out = [binary]
    user_rpc = [t for o in user.items if o.key == "--rpc" for t in o.tokens]
    # --rpc registers devices at parse time; -dev/-ot naming them must come later (docs/server-cli.md §1.3)
    out += user_rpc
    for p in planned:
        if user.sets_family(p.family):
            continue
        out += list(p.tokens)
    out += [t for o in user.items if o.key != "--rpc" for t in o.tokens]
    return out


def family_of(key: str) -> str | None:
    return _FAMILY_OF.get(key)
