"""Text from logs, a lake, a metastore or a registry, made safe to print on a terminal.

Such text is data: a task log's error line, a lease holder, a registry value echoed in an error.
Written raw, a terminal obeys what it holds instead of showing it: an OSC sequence retitles the
window or writes the clipboard (``ESC ] 0 ; ... BEL``), a CSI one clears the screen or moves the
cursor (``ESC [ 2 J``, or its one-byte C1 form U+009B), a carriage return overwrites the line, a
bidi override (U+202E) shows what follows reversed. :func:`printable` escapes every such
character as visible text (``\\x1b``, ``\\u202e``), so what the data holds is shown, never run.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline (decided per call), DEL and C1; the bidi embeddings, overrides
# and isolates and the implicit marks (LRM, RLM, ALM); the line and paragraph separators.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_LINE_BREAKS = re.compile(r"[\t\n]")


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str, multiline: bool = False) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``).

    A single-line field (``multiline`` false: a status line, an error line) gets its tabs and newlines
    escaped too; a multi-line one keeps them.
    """
    out = _UNSAFE.sub(_escaped, text)
    return out if multiline else _LINE_BREAKS.sub(_escaped, out)
