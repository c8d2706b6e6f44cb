"""Generated tokens to text, cut at the first stop string, released only once it is final.

A stream must never send text that a later token turns into (part of) a stop string, nor half of
a character whose bytes span two tokens. :class:`TextAssembler` therefore holds back the last
``longest stop - 1`` characters and a trailing replacement character until more tokens or the end
settle them. The text is decoded from all tokens each time, as byte-level tokenizers only give
correct text for whole sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_PARTIAL_CHARACTER = "\ufffd"


class TextAssembler:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.tokens: list[int] = []
        self.offsets: list[int] = []  # where each token's text starts
        self.text = ""
        self.stopped = False  # a stop string was found; the text ends before it
        self._released = 0

    def add(self, token: int) -> str:
        """Take one more token; returns the text that became final (empty once stopped)."""
        if self.stopped:
            return ""
        self.offsets.append(len(self.text))
        self.tokens.append(token)
        self.text = self._decode(self.tokens)
        cut = self._first_stop()
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self._release(len(self.text))
        safe = len(self.text) - self._hold
        while safe > self._released and self.text[safe - 1] == _PARTIAL_CHARACTER:
            safe -= 1
        return self._release(safe)

    def finish(self) -> str:
        """The text still held back, now that no token will follow."""
        return self._release(len(self.text))

    def kept_tokens(self) -> int:
        """How many tokens have text before the cut (all of them unless a stop string cut some)."""
        return sum(1 for offset in self.offsets if offset < len(self.text)) if self.stopped else len(self.tokens)

    def _first_stop(self) -> int | None:
        # Only text not yet released can hold a new stop string's start.
        start = max(0, self._released - self._hold)
        found = [i for i in (self.text.find(stop, start) for stop in self._stops) if i >= 0]
        return min(found) if found else None

    def _release(self, end: int) -> str:
        if end <= self._released:
            return ""
        piece, self._released = self.text[self._released:end], end
        return piece


__all__ = ["TextAssembler"]
