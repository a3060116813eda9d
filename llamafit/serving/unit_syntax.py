"""Words as a systemd unit file holds them, written and read back (systemd.syntax(7), systemd.service(5)
"Command lines", systemd.exec(5) ``Environment=``, systemd.unit(5) "Specifiers").

A unit is a text of lines: a value with a newline or a carriage return in it, written raw, ends its line and
starts another that the manager reads as a directive of its own. So a word is written in double quotes with
C-style escapes (``\\n``, ``\\r``, ``\\xHH``, ``\\uHHHH``) wherever it holds anything but plain characters, ``%``
as ``%%`` (a specifier otherwise), and in ``ExecStart=`` ``$`` as ``$$`` (a variable otherwise;
``Environment=`` does no ``$`` processing). A word that is not UTF-8 text (bytes a file name may hold, which
Python carries as surrogates) is refused: a unit is UTF-8 text. ``read_service`` reads the lines back the way
the manager does, so a writer can check that what runs is exactly what it meant.
"""

from __future__ import annotations

import re

from llamafit.errors import UsageError
from llamafit.shellwords import quote as shell_quote

_PLAIN = re.compile(r"[^\s\"'\\;\x00-\x1f\x7f-\x9f]+")  # written as it is (outside quotes)
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\a": "\\a", "\b": "\\b"}
_ESCAPES |= {"\f": "\\f", "\v": "\\v"}
_READ = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
_READ |= {"\\": "\\", '"': '"', "'": "'"}
WHITESPACE = " \t\n\r"


def shown(word: str, limit: int = 200) -> str:
    """A word as the user may read it in a message: shell-quoted, escaped, bounded."""
    text = shell_quote(word)
    return text if len(text) <= limit else text[:limit] + "..."


def check_text(word: str) -> None:
    """A UsageError for a word that is not UTF-8 text."""
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"a unit cannot hold this argument (bytes that are not UTF-8 text): {shown(word)}",
            hint="rename the file, or give its path through a link whose name is text",
        ) from None


def quote(word: str, variables: bool = True) -> str:
    """One word as the manager reads it back; ``variables``: ``$`` is special (``ExecStart=``)."""
    check_text(word)
    word = word.replace("%", "%%")
    if variables:
        word = word.replace("$", "$$")
    if _PLAIN.fullmatch(word):
        return word
    out = []
    for c in word:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        elif 0x80 <= ord(c) <= 0x9F:  # a C1 control as its code point (\x would write a raw byte)
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def exec_line(argv: list[str]) -> str:
    return " ".join(quote(a) for a in argv)


def environment_word(key: str, value: str) -> str:
    return quote(f"{key}={value}", variables=False)


def read_service(text: str) -> tuple[list[str] | None, dict[str, str]]:
    """The ``ExecStart=`` argv (the last one; None when there is none) and the ``Environment=`` variables of a
    unit's text, as the manager reads them; a ValueError for what it would not read."""
    argv: list[str] | None = None
    env: dict[str, str] = {}
    for line in _lines(text):
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key.strip() == "ExecStart":
            argv = [_variables(w) for w in split_words(_specifiers(value))]
        elif key.strip() == "Environment":
            for w in split_words(_specifiers(value)):
                k, eq, v = w.partition("=")
                if not eq:
                    raise ValueError(f"Environment= word without '=': {w!r}")
                env[k] = v
    return argv, env


def _lines(text: str) -> list[str]:
    """The unit's logical lines: a line that ends in a backslash goes on in the next (systemd.syntax)."""
    out: list[str] = []
    held = ""
    for raw in re.split(r"\r\n|\r|\n", text):
        if raw.endswith("\\"):
            held += raw[:-1] + " "
            continue
        out.append(held + raw)
        held = ""
    if held:
        out.append(held)
    return out


def _specifiers(value: str) -> str:
    """``%%`` as ``%``; any other specifier is not a word written here."""
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "%":
            if value[i + 1 : i + 2] != "%":
                raise ValueError(f"a specifier %{value[i + 1 : i + 2]} would be expanded")
            i += 1
        out.append(c)
        i += 1
    return "".join(out)


def _variables(word: str) -> str:
    """``$$`` as ``$``; ``$NAME`` or ``${NAME}`` would be substituted."""
    if re.search(r"(?<!\$)(?:\$\$)*\$(?=[A-Za-z_{])", word):
        raise ValueError(f"a variable would be substituted in {word!r}")
    return word.replace("$$", "$")


def split_words(value: str) -> list[str]:
    """The words of a value as systemd's extract_first_word reads them with quotes removed and C escapes
    resolved (the escapes of systemd.syntax(7); any other is an error)."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote_char = ""
        while i < n:
            c = value[i]
            if c == "\\":
                ch, i = _escape(value, i + 1)
                word.append(ch)
                continue
            if quote_char:
                if c == quote_char:
                    quote_char = ""
                else:
                    word.append(c)
            elif c in "\"'":
                quote_char = c
            elif c in WHITESPACE:
                break
            else:
                word.append(c)
            i += 1
        if quote_char:
            raise ValueError("an unbalanced quote")
        words.append("".join(word))


def _escape(value: str, i: int) -> tuple[str, int]:
    """The character a backslash escape at ``value[i:]`` stands for, and the index after it."""
    if i >= len(value):
        raise ValueError("a backslash at the end")
    c = value[i]
    if c in _READ:
        return _READ[c], i + 1
    for prefix, width, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == prefix:
            digits = value[i + 1 : i + 1 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
                raise ValueError(f"a malformed \\{c} escape")
            return chr(int(digits, base)), i + 1 + width
    if c in "01234567":
        digits = value[i : i + 3]
        if not re.fullmatch(r"[0-7]{3}", digits):
            raise ValueError("a malformed octal escape")
        return chr(int(digits, 8)), i + 3
    raise ValueError(f"an unknown escape \\{c}")
