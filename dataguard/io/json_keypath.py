"""Finding the array to read inside a top-level JSON object (``json_key: data.train``).

Some datasets wrap their records: ``{"meta": ..., "data": [...]}``. This walks the object
one structural character at a time, matching keys at each level, until the value of the
last key opens; when the key is missing, or the file is an object and no key was given,
it names the top-level keys it saw so the error can suggest one.
"""

from __future__ import annotations

import json

from dataguard.io.json_problems import FrameError
from dataguard.io.json_structure import CLOSE_OBJECT, COMMA, OPEN_ARRAY, OPEN_OBJECT, WHITESPACE
from dataguard.io.json_window import ByteWindow

KEY_KEEP_BYTES = 64 * 1024  # a key longer than this cannot be the `json_key` we look for
PROBE_BYTES = 64 << 20  # how far to look for the keys of an object to name them in an error


class KeyPath:
    """Walks ``keys`` down from the top-level object whose ``{`` is at ``opened``.

    ``event`` is fed the structural characters after it, in order, and says when one opens
    the wanted array (``depth`` is then that array's level); it raises ``FrameError`` when
    the path cannot lead to an array. ``found`` collects up to 50 top-level keys.
    """

    def __init__(self, keys: list[str], opened: int) -> None:
        self.keys = keys
        self.found: list[str] = []
        self.matched = 0  # how many of `keys` have been matched
        self.depth = 1
        self.level = 1  # depth of the object whose keys are being read
        self.mark: int | None = opened + 1  # where the current key starts (after "{" or ",")
        self.want_value: int | None = None  # the colon after a matched key

    def event(self, p: int, k: int, window: ByteWindow) -> bool:
        """Take the structural character ``k`` at stream offset ``p``; True: it opens the array."""
        if self.want_value is not None:
            between = window.get(self.want_value + 1, p)
            self.want_value = None
            last = self.matched == len(self.keys)
            if between.strip(WHITESPACE) or k != (OPEN_ARRAY if last else OPEN_OBJECT):
                raise FrameError("not_array", self.found)
            self.depth += 1
            if last:
                return True
            self.level, self.mark = self.depth, p + 1
            return False
        if k <= OPEN_OBJECT:
            self.depth += 1
        elif k <= CLOSE_OBJECT:
            if self.depth == self.level:
                raise self.missing(window.end)
            self.depth -= 1
        elif self.depth == self.level:
            if k == COMMA:
                self.mark = p + 1
            else:
                self._colon(p, window)
        return False

    def _colon(self, p: int, window: ByteWindow) -> None:
        key = self._key(p, window)
        if self.level == 1 and key is not None and len(self.found) < 50:
            self.found.append(key)
        if self.matched < len(self.keys) and key == self.keys[self.matched]:
            self.matched += 1
            self.want_value = p
        self.mark = None

    def _key(self, colon: int, window: ByteWindow) -> str | None:
        if self.mark is None or self.mark < window.start:
            return None
        text = window.get(self.mark, colon).strip(WHITESPACE)
        try:
            key = json.loads(text.decode("utf-8"))
        except ValueError:
            return None
        return key if isinstance(key, str) else None

    def keep_from(self, window: ByteWindow) -> int:
        """At the end of a chunk: the first stream offset still needed (a key being read, a
        value about to open). Raises ``FrameError`` for a matched key whose value is no
        container, or once ``PROBE_BYTES`` were read in search of a key that was never given."""
        keep = window.end
        if self.want_value is not None:
            if window.get(self.want_value + 1).strip(WHITESPACE):
                raise FrameError("not_array", self.found)
            self.want_value = window.end - 1
            keep = self.want_value + 1
        if self.mark is not None and window.end - self.mark > KEY_KEEP_BYTES:
            self.mark = None
        if self.mark is not None:
            keep = min(keep, self.mark)
        if not self.keys and window.end > PROBE_BYTES:
            raise self.missing(window.end)
        return keep

    def missing(self, end: int) -> FrameError:
        """No array to read: ``end`` bytes were read, so ``found`` is complete if they cover the probe."""
        return missing(self.keys, self.found, end)


def missing(keys: list[str], found: list[str], end: int) -> FrameError:
    """The error for an object without the array: ``object`` with no key given, else ``missing``."""
    return FrameError("object" if not keys else "missing", found, complete=end <= PROBE_BYTES)
