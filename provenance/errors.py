"""The exceptions the provenance package raises on purpose.

Every malformed input (truncated JSON, bad base64, a wrong payload type, a proof for
another tree size, a key of the wrong type) is a :class:`ProvenanceError` whose message
is one line naming what is wrong. Inputs that are well formed but do not check out (a
signature that does not verify, a proof that does not reach the signed root, a ledger
whose entries disagree with its checkpoints) raise :class:`VerificationFailed`, a
subclass, so callers can tell "garbage" from "forged" when they need to.
"""

from __future__ import annotations

from redteam.errors import RedteamError

__all__ = ["ProvenanceError", "VerificationFailed", "one_line"]


class ProvenanceError(RedteamError, ValueError):
    """Malformed provenance input (keys, envelopes, statements, proofs, checkpoints)."""


class VerificationFailed(ProvenanceError):
    """Well-formed input whose signature, digest or proof does not verify."""


def one_line(text: object, limit: int = 160) -> str:
    """``repr``-like short rendering of untrusted text for error messages."""
    s = text if isinstance(text, str) else repr(text)
    s = s.replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= limit else s[: limit - 1] + "…"
