"""Provenance attacks: getting poisoned training data past the dataset gate.

The attack surfaces that the provenance anchors (in-toto statements in DSSE envelopes, an
RFC 6962 transparency log, signed dataset manifests) expose, each a malicious client
that poisons its shards (``poison``, label flipping by default: Tolpegin et al., ESORICS
2020) and then presents a dataset manifest to ``provenance_gate`` (:mod:`defenses.provenance`):

=====================  =====================================================  ==========
attack                 what it presents                                       gate
=====================  =====================================================  ==========
``unsigned_manifest``  a manifest of the poisoned shards, not signed          detects
``manifest_mismatch``  the curator's honest manifest, signed and logged —     detects
                       but the shards trained on were poisoned afterwards       (attest)
                       (split-view / post-signing substitution, Carlini et
                       al., IEEE S&P 2024)
``unenrolled_key``     poisoned manifest signed by a key it made itself       detects
``keyid_spoof``        the same, with the DSSE ``keyid`` hint naming the      detects
                       curator's enrolled key (the hint is unauthenticated)
``digest_downgrade``   poisoned manifest whose digests are MD5 only,          detects
                       validly signed with the (stolen) enrolled key
``log_fork``           poisoned manifest signed with the stolen enrolled      detects
                       key, hidden from the public log and presented with a   (witness)
                       proof from a forked log view (compromised log key)
``stolen_key``         poisoned manifest signed with the stolen enrolled key  **passes**
                       and logged like any honest one
=====================  =====================================================  ==========

The last row is the honest limit of provenance: signatures attribute data, they do not
vouch for it. Replayed and rolled-back *updates* are
transport-level (``replay`` in :mod:`attacks.transport`).

Capabilities are declared, and the trainer grants exactly those (``capabilities``):
``"enrolled_key"`` — the malicious clients' enrolled (curator) keys, stolen;
``"log_key"`` — the transparency log's checkpoint key (a compromised log operator).
``forge_provenance(manifest, ctx)`` receives the curator's manifest of the clean data
and reads ``ctx.state``: ``client``, ``shards`` (the bytes it actually trains on) and
``keyring`` (:class:`redteam.federation.provenance.Keyring`). It returns a
:class:`~redteam.federation.provenance.Presentation` (or a manifest for the curator to
sign). All signing is deterministic (RFC 6979), and keys it makes itself are drawn
from ``ctx.generator``, so a forgery is reproducible.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.types import Attack, AttackContext, ClientData, Surface, param_error

if TYPE_CHECKING:
    import torch

    from provenance.keys import SigningKey
    from provenance.manifest import DatasetManifest

__all__ = [
    "UnsignedManifest",
    "ManifestMismatch",
    "UnenrolledKey",
    "KeyidSpoof",
    "DigestDowngrade",
    "LogFork",
    "StolenKey",
]


def _client(manifest: "DatasetManifest", ctx: AttackContext) -> int:
    c = ctx.state.get("client") if ctx.state else None
    if isinstance(c, int):
        return c
    tail = str(getattr(manifest, "client", "")).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else (ctx.malicious[0] if ctx.malicious else 0)


def _actual(manifest: "DatasetManifest", ctx: AttackContext) -> "DatasetManifest":
    """A manifest of the shards the client really trains on (the poisoned ones), with the
    curator's metadata; the given manifest when the trainer gives no shards."""
    from provenance.manifest import DatasetManifest

    shards = ctx.state.get("shards") if ctx.state else None
    if not shards:
        return manifest
    m = manifest
    return DatasetManifest.from_shards(
        shards, client=m.client, dataset=m.dataset, version=m.version, license=m.license,
        license_source=m.license_source, source=m.source, creator=m.creator, created_at=m.created_at,
        generated_by=m.generated_by, media_types={f.name: f.media_type for f in m.files}, name=m.name,
    )


def _keyring(ctx: AttackContext) -> Any:
    return ctx.state.get("keyring") if ctx.state else None


def _mint(ctx: AttackContext) -> "SigningKey":
    """A fresh P-256 key of the attacker's own (not enrolled), drawn from ``ctx.generator``."""
    import numpy as np
    import torch

    from redteam.transport.signing import derive_key

    g = ctx.generator
    seed = torch.randint(0, 2**31 - 1, (8,), generator=g, device=g.device).tolist()
    return derive_key(np.random.default_rng(seed), "p256")


def _stolen(client: int, ctx: AttackContext) -> "SigningKey | None":
    ring = _keyring(ctx)
    return ring.stolen.get(client) if ring is not None else None


def _signed(client: int, payload: bytes, key: "SigningKey", *, keyid: str | None = None) -> Any:
    from provenance import dsse
    from redteam.federation.provenance import Presentation

    env = dsse.sign(payload, key, keyid=keyid).to_json()
    return Presentation(client, env, key.public)


@dataclass(frozen=True, slots=True)
class _Poisoning(Attack):
    """Shared: the data poisoning the forged provenance is meant to hide.

    * ``poison``: ``"label_flip"`` (y ↦ C − 1 − y on every sample, Tolpegin et al. 2020)
      or ``"none"`` (clean data: the provenance forgery alone);
    * ``num_classes``: C for the label flip.
    """

    poison: Literal["label_flip", "none"] = "label_flip"
    num_classes: int = 10

    def validate_poison(self, v: str) -> None:
        if v not in ("label_flip", "none"):
            raise param_error(self, "poison", v, "must be 'label_flip' or 'none'")

    def validate_num_classes(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise param_error(self, "num_classes", v, "must be an integer ≥ 2")

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        if self.poison == "none":
            return data
        from .label_flip import LabelFlip

        return LabelFlip(mapping="reverse", num_classes=self.num_classes).poison_data(data, client, generator)


@dataclass(frozen=True, slots=True)
class UnsignedManifest(_Poisoning):
    """Present a manifest of the poisoned shards with no signature at all (unsigned data).
    Expected: the gate refuses it (no DSSE envelope)."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned data under an unsigned manifest"
    reference: ClassVar[str] = "DSSE v1; in-toto Statement v1 (an unsigned or tampered statement)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        from redteam.federation.provenance import Presentation

        m = _actual(manifest, ctx)
        return Presentation(_client(manifest, ctx), None, None, statement=m.to_json(), log="none")


@dataclass(frozen=True, slots=True)
class ManifestMismatch(_Poisoning):
    """Train on poisoned shards under the curator's honest manifest, which was signed and
    logged before the poisoning (split-view poisoning: Carlini et al., "Poisoning
    Web-Scale Training Datasets is Practical", IEEE S&P 2024, arXiv:2302.10149).
    Expected: the gate's attestation finds shard digests that differ from the manifest."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned shards under the curator's honest, signed manifest"
    reference: ClassVar[str] = "Carlini et al., IEEE S&P 2024 (poisoning web-scale training datasets)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        return manifest  # the curator signs what it saw: the clean data


@dataclass(frozen=True, slots=True)
class UnenrolledKey(_Poisoning):
    """Sign the poisoned manifest with a key the attacker made itself and log it (the log
    accepts any well-signed entry). Expected: the gate refuses a signature that is not
    by the client's enrolled key (key confusion)."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned manifest signed by an unenrolled key"
    reference: ClassVar[str] = "DSSE v1; in-toto Statement v1 (a key the verifier never enrolled)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        return _signed(_client(manifest, ctx), _actual(manifest, ctx).to_json(), _mint(ctx))


@dataclass(frozen=True, slots=True)
class KeyidSpoof(_Poisoning):
    """Sign the poisoned manifest with an unenrolled key, but set the envelope's ``keyid``
    hint to the id of the client's enrolled key (DSSE: "keyid is an unauthenticated
    hint"; keyid spoofing). A verifier that picks the key by the hint, or trusts the
    hint, is fooled; ours derives the key from the client's enrollment. Expected: refused."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned manifest signed by another key under the enrolled key's keyid"
    reference: ClassVar[str] = "DSSE v1 (keyid is an unauthenticated hint)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        c = _client(manifest, ctx)
        ring = _keyring(ctx)
        pub = ring.enrolled_public.get(c) if ring is not None else None
        keyid = pub.keyid if pub is not None else hashlib.sha256(f"client-{c}".encode()).hexdigest()
        return _signed(c, _actual(manifest, ctx).to_json(), _mint(ctx), keyid=keyid)


@dataclass(frozen=True, slots=True)
class DigestDowngrade(_Poisoning):
    """Present a manifest of the poisoned shards whose subject and resources carry MD5
    digests only, signed with the client's (stolen) enrolled key: a verifier that accepts
    "any algorithm it knows" (the in-toto DigestSet rule) would match on a collidable
    hash (digest-algorithm downgrade). Expected: the gate requires SHA-256 and
    refuses it, whatever the signature. Without the stolen key it signs with its own."""

    capabilities: ClassVar[tuple[str, ...]] = ("enrolled_key",)
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned manifest with MD5-only digests (algorithm downgrade)"
    reference: ClassVar[str] = "in-toto Attestation Framework, ResourceDescriptor DigestSet (algorithm agility)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        from provenance.intoto import Statement, Subject

        c = _client(manifest, ctx)
        m = _actual(manifest, ctx)
        shards = (ctx.state.get("shards") if ctx.state else None) or {}
        md5 = {f.name: hashlib.md5(shards.get(f.name, bytes.fromhex(f.sha256)), usedforsecurity=False).digest()
               for f in m.files}
        st = m.statement().to_dict()
        pred = st["predicate"]
        pred["resources"] = [{"name": f.name, "algorithm": "md5", "digest": md5[f.name].hex()} for f in m.files]
        pred["serialization"]["hash_type"] = "md5"
        for entry in pred["dataset"]["files"]:
            entry["md5"] = md5[entry["name"]].hex()
            del entry["sha256"]
        root = hashlib.md5(b"".join(md5[f.name] for f in m.files), usedforsecurity=False).hexdigest()
        payload = Statement((Subject(m.name, {"md5": root}),), st["predicateType"], pred).to_json()
        key = _stolen(c, ctx) or _mint(ctx)
        return _signed(c, payload, key)


@dataclass(frozen=True, slots=True)
class LogFork(_Poisoning):
    """Hide the poisoned manifest from the public log: sign it with the stolen enrolled
    key, do not log it, and present an inclusion proof against a checkpoint of a forked
    tree — same size as the public log, different root — signed with the compromised
    log key (log equivocation / fork; a split view). Expected: a gate that compares
    checkpoints with the log it audits (``witness``) finds two signed roots for one size;
    one that trusts any log-signed checkpoint admits it. Without both keys it presents
    the curator's manifest (nothing to fork)."""

    capabilities: ClassVar[tuple[str, ...]] = ("enrolled_key", "log_key")
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned manifest included only in a forked log view (equivocating checkpoint)"
    reference: ClassVar[str] = "RFC 6962/9162; C2SP tlog-checkpoint and tlog-witness (split views)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        from provenance import checkpoint as cp
        from provenance import dsse
        from provenance.bundle import dsse_body
        from provenance.merkle import InclusionProof, inclusion_ranges, leaf_hash, root_from_leaves
        from redteam.federation.provenance import Presentation

        c = _client(manifest, ctx)
        ring = _keyring(ctx)
        key = _stolen(c, ctx)
        if ring is None or key is None or ring.log_key is None:
            return manifest
        env = dsse.sign(_actual(manifest, ctx).to_json(), key)
        size = max(1, int(ring.log_size))
        index = size - 1  # the forged tree: filler leaves, then this envelope's entry
        leaves = [leaf_hash(f"fork-filler-{i}".encode()) for i in range(size - 1)]
        leaves.append(leaf_hash(dsse_body(env, key.public)))
        root = root_from_leaves(leaves)
        path = tuple(root_from_leaves(leaves[a:b]) for a, b in inclusion_ranges(index, size))
        note = cp.sign(cp.Checkpoint(ring.origin, size, root), ring.log_key)
        proof = InclusionProof(index, size, root, path, note).to_dict()
        return Presentation(c, env.to_json(), key.public, log="forged", proof=proof)


@dataclass(frozen=True, slots=True)
class StolenKey(_Poisoning):
    """Sign a manifest of the poisoned shards with the client's enrolled key, stolen from
    its curator, and log it like any honest manifest (a valid signature
    over poisoned content: the ledger can name who signed it, not stop it).

    Expected, honestly: it **passes** the gate — signature, log inclusion and attestation
    all check out, because the manifest truly describes the (poisoned) data. Only
    data-level or training-time defenses can help; the log records who signed it."""

    capabilities: ClassVar[tuple[str, ...]] = ("enrolled_key",)
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.PROVENANCE)
    summary: ClassVar[str] = "Poisoned data signed with a stolen enrolled key (passes the gate)"
    reference: ClassVar[str] = "Carlini et al., IEEE S&P 2024 (correctly signed but poisoned content)"

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        c = _client(manifest, ctx)
        actual = _actual(manifest, ctx)
        key = _stolen(c, ctx)
        return _signed(c, actual.to_json(), key) if key is not None else actual
