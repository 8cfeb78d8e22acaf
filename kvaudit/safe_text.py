"""Text from traces, rule files and the network, made safe to show on a terminal.

A replica name, a key, a label or a file name is data: shown, it must never act on
the terminal. Every control character (C0, DEL, C1: ESC starting a sequence that
clears the screen, sets the window title or opens an OSC 8 link; BEL; a newline that
would break a table row) and every bidirectional formatting character (which can
reorder what is shown around it) is written out as a Python-style escape: ESC shows as
`\\x1b`, RIGHT-TO-LEFT OVERRIDE as `\\u202e`. JSON output keeps its values and escapes
them the JSON way (`json_safe`).

Escaping Rich markup is the other half, and is done where Rich is used: values go into
`rich.text.Text` objects (never into markup strings), and messages that pass through
markup-rendering APIs are given with markup off.

Standard library only: the serving side shares this package's top level.
"""

from __future__ import annotations

import re
from typing import Final

# Unicode's bidirectional formatting characters (marks, embeddings, overrides, isolates).
_BIDI: Final = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS: Final = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
_ESCAPES: Final = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _BIDI}
_UNSAFE: Final = re.compile("[" + "".join(re.escape(chr(c)) for c in _ESCAPES) + "]")


# In JSON text: what JSON encoders leave raw (they escape C0 only) that still acts on a terminal.
_JSON_UNSAFE: Final = re.compile("[" + "".join(re.escape(chr(c)) for c in (0x7F, *range(0x80, 0xA0), *_BIDI)) + "]")


def json_safe(text: str) -> str:
    """JSON text with DEL, C1 controls and bidirectional formatting characters written as `\\uXXXX`
    escapes: the same JSON value, and nothing in it acts on a terminal it is printed on."""
    if _JSON_UNSAFE.search(text) is None:
        return text
    return _JSON_UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def visible(text: str) -> str:
    """`text` with each control and bidirectional formatting character written out as an escape."""
    if _UNSAFE.search(text) is None:  # the usual case: nothing to copy
        return text
    return text.translate(_ESCAPES)
