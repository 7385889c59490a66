"""The exceptions redteam raises on purpose.

Every error a user can cause (a bad scenario file, an unknown plugin name, a bad
parameter, a malformed encoded update) is one of these, and its message names what
was wrong, the value, and what was expected. The CLI prints them as one line and
exits non-zero; it never shows a traceback for them.
"""

from __future__ import annotations

__all__ = [
    "RedteamError",
    "InvalidScenario",
    "InvalidParameter",
    "UnknownPlugin",
    "DecodeError",
    "TransportError",
]


class RedteamError(Exception):
    """Base class of every deliberate redteam error."""


class InvalidScenario(RedteamError):
    """A scenario file (or a dict standing for one) is malformed.

    The message reads like ``smoke.toml: [federation].clients = -3: must be ≥ 1``.
    """


class InvalidParameter(RedteamError, ValueError):
    """A plugin (attack, defense, workload, codec) was given a bad parameter."""


class UnknownPlugin(RedteamError, LookupError):
    """No plugin of that name is registered; the message lists close matches."""


class DecodeError(RedteamError, ValueError):
    """Bytes that claim to be an encoded update are not a valid one.

    Raised by codecs on malformed headers, wrong lengths, wrong dtypes, out-of-range
    indices or non-finite values. The round loop turns it into a rejection of that
    one update with the message as its reason.
    """


class TransportError(RedteamError):
    """A chunked transfer could not be reassembled (bad or missing chunk)."""
