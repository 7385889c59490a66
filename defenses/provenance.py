"""Provenance defenses: signed update headers (``signed_chunks``) and the dataset gate
(``provenance_gate``).

Both act *before* aggregation, at the stages a scenario cannot otherwise reach, so the
trainer looks for them in the defense pipeline (their ``acts_at``) and runs them there;
inside the pipeline itself they accept every update unchanged, so
``[{name = "signed_chunks"}, {name = "median"}]`` means "verify, then take the median".

**Signed chunks** (issue 4; the chunk protocol of BitTorrent v2 — per-chunk SHA-256
under a signed root, Cohen & Norberg, BEP 52 — with the binding of round, sender, nonce
and base model that detecting replay and equivocation needs).
Each client signs its update manifest as an in-toto statement in a DSSE envelope with
its enrolled P-256 key (:mod:`redteam.transport.signing`). The receiver accepts a header
only if the envelope verifies against *the sender's* enrolled key (never a key chosen by
the envelope's ``keyid``, which DSSE leaves unauthenticated), the statement names the
sender, its nonce was never accepted before, its round is the current round and its
parent digest is the current global model; otherwise the update is rejected with the
reason (bad signature, unknown key, replay, rollback, reused nonce). Chunks are then
checked against the *signed* digests, so substitution and mix-and-match fail. With
``gossip`` the sub-aggregators exchange the signed headers they accepted: two valid
signatures by one sender over different headers for one round prove equivocation, and
the sender is banned (two signatures for one (sender, round) are proof enough).

What it cannot do: an update that its own sender poisoned and signed is authentic.

**Provenance gate** (issue 4; against split-view poisoning, Carlini et al., IEEE S&P 2024,
and the attacks on in-toto/DSSE signing and RFC 6962 logs in :mod:`attacks.provenance`).
Before training, each client presents its dataset manifest (OpenSSF model-signing v1.0
layout, in-toto in DSSE) and the transparency log's inclusion proof for it. The gate requires, in
order: a signature (unsigned → excluded), by the client's *enrolled* key (unenrolled
key, keyid spoofing → excluded), a statement that carries SHA-256 digests (a subject
or resource offering only a weaker algorithm is a digest-algorithm downgrade →
excluded), naming this client, an RFC 6962 inclusion proof of exactly this envelope
against a checkpoint signed by the log (not logged → excluded), with ``witness`` that
checkpoint must agree with the log the gate itself audits (a forked / equivocating
checkpoint, or one from a split view ahead of it → excluded), and with ``attest`` the
shards the client actually trains on must match the manifest's digests (the simulator
knows the truth, which models a remote attestation; poisoned shards under an honest
manifest → excluded). An excluded client takes part in no round.

What it cannot do: a manifest signed with a stolen enrolled key over poisoned shards
passes every check — signatures attribute data, they do not vouch for it
(``stolen_key`` in :mod:`attacks.provenance`). The tests show this honestly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping, Sequence

from provenance import checkpoint as _checkpoint, dsse
from provenance.bundle import dsse_body
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.ledger import verify_inclusion_document
from provenance.manifest import DatasetManifest
from redteam.errors import TransportError
from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext, param_error

if TYPE_CHECKING:
    import torch

    from provenance.keys import VerifyingKey
    from provenance.ledger import Ledger
    from redteam.transport.chunking import UpdateManifest

__all__ = ["HeaderRejected", "ProvenanceGate", "SignedChunks", "UpdateVerifier"]


class HeaderRejected(TransportError):
    """A signed update header failed verification (the message is the reason)."""


def _accept_all(updates: "torch.Tensor") -> FilterResult:
    import torch

    return FilterResult(updates=updates, accepted=torch.ones(updates.shape[0], dtype=torch.bool,
                                                             device=updates.device))


def _check_bool(obj: Any, name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise param_error(obj, name, v, "must be true or false")


def _check_policy(obj: Any, v: Any) -> None:
    if v not in ("match", "ignore"):
        raise param_error(obj, "keyid_policy", v, "must be 'match' (a keyid hint must name the key that "
                                                  "signed) or 'ignore' (the hint is not read)")


# ----------------------------------------------------------------------------- signed chunks
@dataclass
class UpdateVerifier:
    """The receiver's side of signed update headers, for one run.

    ``enrolled`` maps client id → enrolled public key. The verifier remembers every nonce
    it accepted (per sender), so it must live as long as the run.
    """

    enrolled: Mapping[int, "VerifyingKey"]
    keyid_policy: str = "match"
    nonces: dict[int, set[str]] = field(default_factory=dict)

    def open(self, author: int, header: bytes, *, round: int, parent_digest: str) -> "UpdateManifest":
        """Verify ``header`` as sent by ``author`` in ``round`` on top of ``parent_digest``.

        Returns the signed manifest; raises :class:`HeaderRejected` with the reason.
        """
        from redteam.transport.chunking import ManifestError
        from redteam.transport.signing import is_signed, manifest_from_statement

        if not is_signed(header):
            raise HeaderRejected("unsigned header (signed_chunks requires a DSSE envelope)")
        key = self.enrolled.get(author)
        if key is None:
            raise HeaderRejected(f"unknown key: client {author} has no enrolled key")
        try:
            env = dsse.Envelope.from_json(bytes(header), "update header", urlsafe=False)
            ok = dsse.verify(env, key, max_signatures=1, keyid_policy=self.keyid_policy)  # type: ignore[arg-type]
        except VerificationFailed as exc:
            raise HeaderRejected(f"bad signature: {exc}") from None
        except ProvenanceError as exc:
            raise HeaderRejected(f"malformed signed header: {exc}") from None
        try:
            m = manifest_from_statement(ok.payload)
        except ManifestError as exc:
            raise HeaderRejected(f"malformed update statement: {exc}") from None
        if m.client != author:
            raise HeaderRejected(f"header names client {m.client}, sent by client {author}")
        seen = self.nonces.setdefault(author, set())
        if m.nonce in seen:
            raise HeaderRejected(f"reused nonce {m.nonce[:12]}… (replay of an update accepted earlier, "
                                 f"signed for round {m.round})")
        if m.round != round:
            what = "replay" if m.round < round else "pre-play"
            raise HeaderRejected(f"{what}: header is signed for round {m.round}, this is round {round}")
        if m.parent_digest != parent_digest:
            raise HeaderRejected(f"rollback: header's parent model {m.parent_digest[:12]}… is not the current "
                                 f"model {parent_digest[:12]}…")
        seen.add(m.nonce)
        return m


@dataclass(frozen=True, slots=True)
class SignedChunks(Filter):
    """Clients sign their update headers; receivers verify before accepting (see module doc).

    * ``gossip``: sub-aggregators exchange accepted signed headers; a sender with two
      different valid headers for one round is rejected for equivocation;
    * ``ban``: an equivocating sender is excluded from every later round (its two
      signatures are a proof anyone can check);
    * ``keyid_policy``: ``"match"`` rejects an envelope whose keyid hint is not the id of
      the sender's enrolled key; ``"ignore"`` does not read the hint.

    In the aggregation pipeline it accepts every update unchanged.
    """

    gossip: bool = True
    ban: bool = True
    keyid_policy: Literal["match", "ignore"] = "match"
    acts_at: ClassVar[str] = "transport"
    screens_nonfinite: ClassVar[bool] = False  # judges signatures, not values: `sanity` screens those
    summary: ClassVar[str] = "Signed update headers (in-toto/DSSE): reject forgery, replay, rollback, equivocation"
    reference: ClassVar[str] = "DSSE v1; in-toto Statement v1; BEP 52 (Merkle piece roots)"

    def validate_gossip(self, v: bool) -> None:
        _check_bool(self, "gossip", v)

    def validate_ban(self, v: bool) -> None:
        _check_bool(self, "ban", v)

    def validate_keyid_policy(self, v: str) -> None:
        _check_policy(self, v)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        return _accept_all(updates)

    def verifier(self, enrolled: Mapping[int, "VerifyingKey"]) -> UpdateVerifier:
        """A fresh receiver for one run."""
        return UpdateVerifier(dict(enrolled), self.keyid_policy)

    def equivocations(self, headers: Mapping[int, Sequence[bytes]], round: int) -> dict[int, str]:
        """Senders with more than one distinct *verified* header this round → the reason."""
        from redteam.transport.signing import read_header

        out: dict[int, str] = {}
        if not self.gossip:
            return out
        for c, hs in headers.items():
            distinct = list(dict.fromkeys(bytes(h) for h in hs))
            if len(distinct) > 1:
                a, b = read_header(distinct[0]), read_header(distinct[1])
                if a.merkle_root != b.merkle_root:
                    what = f"Merkle roots {a.merkle_root[:12]}… and {b.merkle_root[:12]}…"
                else:
                    what = f"one Merkle root {a.merkle_root[:12]}…, nonces {a.nonce[:8]}… and {b.nonce[:8]}…"
                out[int(c)] = f"equivocation: {len(distinct)} different signed headers for round {round} ({what})"
        return out


# ----------------------------------------------------------------------------- provenance gate
@dataclass(frozen=True, slots=True)
class ProvenanceGate(Filter):
    """Admit a client only with a verified, logged dataset manifest that matches its data.

    * ``witness``: compare the log checkpoint a client presents with the log the gate
      audits (fork / split-view detection); off, any checkpoint the log key signed passes;
    * ``attest``: check the shards the client trains on against the manifest's digests;
    * ``keyid_policy``: as for :class:`SignedChunks`.

    In the aggregation pipeline it accepts every update unchanged.
    """

    witness: bool = True
    attest: bool = True
    keyid_policy: Literal["match", "ignore"] = "match"
    acts_at: ClassVar[str] = "admission"
    screens_nonfinite: ClassVar[bool] = False  # judges signatures, not values: `sanity` screens those
    summary: ClassVar[str] = "Dataset provenance gate: enrolled-key signature, log inclusion, shard attestation"
    reference: ClassVar[str] = "OpenSSF model-signing v1.0; in-toto/DSSE; RFC 6962/9162; Carlini et al., IEEE S&P 2024"

    def validate_witness(self, v: bool) -> None:
        _check_bool(self, "witness", v)

    def validate_attest(self, v: bool) -> None:
        _check_bool(self, "attest", v)

    def validate_keyid_policy(self, v: str) -> None:
        _check_policy(self, v)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        return _accept_all(updates)

    def admit(
        self,
        presentations: Mapping[int, Any],
        proofs: Mapping[int, Mapping[str, Any] | None],
        shards: Mapping[int, Mapping[str, bytes]],
        enrolled: Mapping[int, "VerifyingKey"],
        log: "Ledger",
    ) -> dict[int, str]:
        """Check every presentation; return client → why it is excluded (admitted: absent).

        ``presentations[c]`` has ``envelope`` (DSSE JSON bytes or ``None``); ``proofs[c]``
        is the inclusion-proof document it presents (``ledger prove`` JSON with its
        checkpoint) or ``None``; ``shards[c]`` are the bytes client ``c`` trains on.
        """
        out: dict[int, str] = {}
        for c in sorted(presentations):
            why = self._check(c, presentations[c], proofs.get(c), shards.get(c, {}), enrolled, log)
            if why is not None:
                out[c] = f"provenance gate: {why}"
        return out

    def _check(self, c: int, p: Any, proof: Mapping[str, Any] | None, shards: Mapping[str, bytes],
               enrolled: Mapping[int, "VerifyingKey"], log: "Ledger") -> str | None:
        envelope = getattr(p, "envelope", None)
        if envelope is None:
            return "unsigned manifest (no DSSE envelope)"
        key = enrolled.get(c)
        if key is None:
            return f"client {c} has no enrolled key"
        try:
            env = dsse.Envelope.from_json(bytes(envelope), "dataset manifest envelope")
            ok = dsse.verify(env, key, max_signatures=1, keyid_policy=self.keyid_policy)  # type: ignore[arg-type]
        except VerificationFailed as exc:
            return f"signature is not by the client's enrolled key ({exc})"
        except ProvenanceError as exc:
            return f"malformed envelope ({exc})"
        try:
            manifest = DatasetManifest.from_statement(ok.payload)
        except ProvenanceError as exc:
            return f"manifest rejected: {exc}"
        if manifest.client != f"client-{c}":
            return f"manifest names {manifest.client!r}, presented by client-{c}"
        if proof is None:
            return "manifest is not in the transparency log"
        try:
            verify_inclusion_document(proof, dsse_body(env, key), log.log_public, log.origin)
            cp = _checkpoint.parse(proof["checkpoint"])[0]
        except (ProvenanceError, KeyError, TypeError) as exc:
            return f"inclusion proof rejected: {exc}"
        if self.witness:
            size = log.size
            if cp.size > size:
                return (f"log checkpoint for tree size {cp.size} is ahead of the log the gate audits "
                        f"(size {size}): a split view")
            real = log.root(cp.size)
            if real != cp.root:
                return (f"log fork: the presented checkpoint for tree size {cp.size} has root "
                        f"{cp.root.hex()[:16]}…, the audited log has {real.hex()[:16]}… (equivocating checkpoints)")
        if self.attest:
            problems = manifest.check_shards(shards)
            if problems:
                more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                return f"attestation: the shards trained on do not match the manifest: {problems[0]}{more}"
        return None
