"""Text from outside shown safely in a terminal or a log line: the one escaping function.

Whatever a node sends (its id, its Envoy version string, a NACK's message), what another replica
shares through etcd and what a client puts in a request may end up in an operator's terminal
(`ballast status`, `decisions`, `rollout status`, `explain`, `plan`) or in the server's log.
Raw, `ESC ] 0 ; … BEL` retitles the terminal, `ESC [ 2 J` clears it, `\\r\\n` starts a line
that looks like Ballast's own. `escape` shows each such character as a Python-style escape
instead (`\\x1b`, `\\r`, `\\n`, `\\u202e`), so the text still reads and can do nothing:

- C0 controls U+0000 to U+001F (newline and tab too: a value stays on its line), DEL and the C1
  controls U+007F to U+009F (some terminals take U+009B as CSI);
- Unicode's line and paragraph separators (U+2028, U+2029) and the bidirectional formatting
  characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069), which make a terminal
  show text in another order than it is ("Trojan Source").

Backslashes are left as they are, so escaping is idempotent (`escape(escape(s)) == escape(s)`):
text escaped where it entered (a gate reading's NACK message) is shown unchanged again. The
dashboard escapes for HTML on its own (it builds DOM text nodes, never markup). `escaped` applies
`escape` to every string of a JSON value (keys too), for output built from a server's answer.
"""

from __future__ import annotations

from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CODES = [
    *range(0x00, 0x20), *range(0x7F, 0xA0),
    0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A),
]
_TABLE = {code: _NAMED.get(chr(code)) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
          for code in _CODES}


def escape(text: str) -> str:
    """`text` with every control, separator and bidirectional formatting character shown as
    an escape (see the module docstring); other text, backslashes included, unchanged."""
    return text.translate(_TABLE)


def escaped(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with `escape` applied to every string in
    it, dict keys included; what is not a string is returned as it is."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escaped(key): escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [escaped(item) for item in value]
    return value
