"""Handler text as a terminal shows it rather than obeys it.

Progress messages, errors, log lines and even queue names come from handlers and from
whoever may enqueue: every human output of ``tide`` passes them through :func:`safe`.
``--json`` output never does: it stays exact.
"""

from __future__ import annotations

import re

#: What a terminal would obey rather than show: C0 controls (ESC, CR, BEL, backspace...),
#: DEL, C1 controls (CSI, OSC...), the bidirectional overrides, embeddings and isolates
#: (which reorder what follows them), and the line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                      "\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object, *, multiline: bool = False) -> str:
    """``text`` (a handler's message, error or log line, a name anyone could enqueue) as a
    terminal shows it rather than obeys it: every control character is escaped, ``ESC``
    reads ``\\x1b``, ``CR`` ``\\r``, a bidi override ``\\u202e``. ``multiline`` keeps the
    newlines (and tabs) of a text meant to span lines, such as a traceback. ``--json``
    output never goes through here: it stays exact."""
    text = "" if text is None else str(text)
    if multiline:
        return "\n".join(_CONTROL.sub(_escape_but_tab, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape, text)


def _escape_but_tab(match: re.Match[str]) -> str:
    return "\t" if match.group() == "\t" else _escape(match)
