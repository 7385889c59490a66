"""Signed update headers and the provenance gate inside the trainer (issue 4).

Worked examples: the signed statement's fields by hand, the verifier's reason for each
forgery, and every provenance attack scored as the literature leads us to expect — all
detected except a stolen enrolled key signing poisoned data, which passes the gate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.provenance import HeaderRejected, ProvenanceGate, SignedChunks
from provenance import dsse
from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario
from redteam.transport import Network, NetworkConfig, build_manifest
from redteam.transport.chunking import ManifestError
from redteam.transport.signing import (
    derive_key,
    forge_header,
    manifest_from_statement,
    read_header,
    sign_update,
    update_statement,
)

PARENT = "ab" * 32
KEYS = [derive_key(np.random.default_rng(100 + i)) for i in range(3)]


def _manifest(payload: bytes = bytes(range(256)) + b"xyz" * 15, round: int = 3, client: int = 0,
              nonce: str = "01" * 16, parent: str = PARENT):
    return build_manifest(payload, round=round, client=client, parent_digest=parent, codec="none()",
                          chunk_size=128, nonce=nonce)


def _scenario(defense=("mean",), attack=None, rounds=1, clients=8, **sections):
    doc = {
        "scenario": {"seed": 1},
        "workload": {"name": "digits"},
        "federation": {"clients": clients, "rounds": rounds, "lr": 0.2, "malicious_fraction": 0.25,
                       "partition": "iid", "local_steps": 5},
        "transport": {"chunk_size": 4096},
        "defense": {"pipeline": [{"name": d} if isinstance(d, str) else d for d in defense]},
    }
    if attack is not None:
        doc["attack"] = attack
    for k, v in sections.items():
        doc.setdefault(k, {}).update(v)
    return parse_scenario(doc)


# ----------------------------------------------------------------------------- the signed statement
def test_update_statement_binds_round_client_nonce_parent_codec_and_every_chunk():
    m, chunks = _manifest()
    assert len(chunks) == 3  # 301 bytes at 128 per chunk
    st = json.loads(update_statement(m))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://redteam.dev/federated-update/v1"
    assert st["subject"] == [{"name": f"chunk/{i}", "digest": {"sha256": hashlib.sha256(c).hexdigest()}}
                             for i, c in enumerate(chunks)]
    assert st["predicate"] == {
        "round": 3, "client": 0, "nonce": "01" * 16, "parentDigest": {"sha256": PARENT}, "codec": "none()",
        "payloadLength": 301, "chunkSize": 128, "merkleRoot": {"sha256": m.merkle_root},
    }
    assert manifest_from_statement(update_statement(m)) == m


def test_signed_header_is_a_dsse_envelope_securesystemslib_verifies():
    from securesystemslib.dsse import Envelope as SslibEnvelope
    from securesystemslib.signer import SSlibKey

    m, _ = _manifest()
    header = sign_update(m, KEYS[0])
    theirs = SslibEnvelope.from_dict(json.loads(header))
    ssl_key = SSlibKey.from_crypto(KEYS[0].public.key)
    assert list(theirs.verify([ssl_key], 1)) == [KEYS[0].keyid]
    assert theirs.payload_type == "application/vnd.in-toto+json"
    assert read_header(header) == m


def test_keys_and_signatures_are_reproducible_from_the_seed():
    m, _ = _manifest()
    again = derive_key(np.random.default_rng(100))
    assert again.public == KEYS[0].public and again.public != KEYS[1].public
    assert sign_update(m, again) == sign_update(m, KEYS[0])  # RFC 6979: same key, same message, same bytes


def test_statement_parser_refuses_malformed_fields():
    m, _ = _manifest()
    st = json.loads(update_statement(m))
    st["subject"][1]["name"] = "chunk/7"
    with pytest.raises(ManifestError, match="expected 'chunk/1'"):
        manifest_from_statement(json.dumps(st).encode())
    st = json.loads(update_statement(m))
    st["subject"][0]["digest"] = {"md5": "00" * 16}
    with pytest.raises(ManifestError, match="sha256 is required"):
        manifest_from_statement(json.dumps(st).encode())
    st = json.loads(update_statement(m))
    st["predicate"]["round"] = "3"
    with pytest.raises(ManifestError, match="predicate.round"):
        manifest_from_statement(json.dumps(st).encode())


# ----------------------------------------------------------------------------- the verifier
def _verifier():
    return SignedChunks().verifier({0: KEYS[0].public, 1: KEYS[1].public})


def test_verifier_accepts_an_honest_header_and_names_every_forgery():
    v = _verifier()
    m, _ = _manifest()
    header = sign_update(m, KEYS[0])
    assert v.open(0, header, round=3, parent_digest=PARENT) == m

    def reason(author, h, round=3, parent=PARENT):
        with pytest.raises(HeaderRejected) as exc:
            v.open(author, h, round=round, parent_digest=parent)
        return str(exc.value)

    assert reason(0, header).startswith("reused nonce 010101010101… (replay of an update accepted earlier")
    old = sign_update(_manifest(round=2, nonce="02" * 16)[0], KEYS[0])
    assert reason(0, old) == "replay: header is signed for round 2, this is round 3"
    stale = sign_update(_manifest(nonce="03" * 16, parent="cd" * 32)[0], KEYS[0])
    assert reason(0, stale) == \
        "rollback: header's parent model cdcdcdcdcdcd… is not the current model abababababab…"
    other = sign_update(_manifest(nonce="04" * 16)[0], KEYS[1])  # client 1's key, sent as client 0
    assert reason(0, other).startswith("bad signature: ")
    assert reason(2, sign_update(_manifest(client=2, nonce="05" * 16)[0], KEYS[2])) == \
        "unknown key: client 2 has no enrolled key"
    assert reason(0, _manifest(nonce="06" * 16)[0].to_json()).startswith("unsigned header")
    assert reason(0, sign_update(_manifest(client=1, nonce="07" * 16)[0], KEYS[0])) == \
        "header names client 1, sent by client 0"
    # a forger without the key rewrites the statement under the old signature
    fresh = sign_update(_manifest(nonce="08" * 16)[0], KEYS[0])
    forged = forge_header(fresh, dataclasses.replace(read_header(fresh), round=3, nonce="09" * 16))
    assert reason(0, forged).startswith("bad signature: ")
    # keyid spoofing: client 1's key signs, the hint claims client 0's key
    spoof = dsse.sign(update_statement(_manifest(nonce="0a" * 16)[0]), KEYS[1], keyid=KEYS[0].keyid).to_json()
    assert reason(0, spoof).startswith("bad signature: ")
    assert reason(0, b'{"payload":"!!"}').startswith("malformed signed header")
    # nothing rejected was remembered: the honest nonce is the only one consumed
    assert v.nonces == {0: {"01" * 16}}


def test_equivocation_needs_two_different_verified_headers_and_gossip():
    a = sign_update(_manifest(nonce="11" * 16)[0], KEYS[0])
    b = sign_update(_manifest(nonce="12" * 16)[0], KEYS[0])
    found = SignedChunks().equivocations({0: [a, b], 1: [a]}, 3)
    root = read_header(a).merkle_root
    assert found == {0: f"equivocation: 2 different signed headers for round 3 (one Merkle root {root[:12]}…, "
                        f"nonces 11111111… and 12121212…)"}
    assert SignedChunks().equivocations({0: [a, a]}, 3) == {}
    assert SignedChunks(gossip=False).equivocations({0: [a, b]}, 3) == {}


def test_defense_parameters_are_validated_and_it_is_an_identity_filter():
    import torch

    with pytest.raises(InvalidParameter, match=r"SignedChunks.gossip = 'yes': must be true or false"):
        SignedChunks(gossip="yes")
    with pytest.raises(InvalidParameter, match=r"ProvenanceGate.keyid_policy = 'trust'"):
        ProvenanceGate(keyid_policy="trust")
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    for d in (SignedChunks(), ProvenanceGate()):
        dec = d(x)
        assert dec.accepted.tolist() == [True, True] and dec.aggregate.tolist() == [2.0, 3.0]
    sc = _scenario(("signed_chunks", "provenance_gate", "median"))
    assert sc.defense_label() == "signed_chunks+provenance_gate+median"
    with pytest.raises(InvalidScenario,
                       match=r"\[defense.pipeline\[0\]\]: defense 'signed_chunks': parameter 'ban' = 3: expected true"):
        _scenario(({"name": "signed_chunks", "ban": 3}, "mean"))


# ----------------------------------------------------------------------------- headers on the network
def test_signed_headers_travel_and_are_counted_on_the_wire():
    flat = dict(bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0)
    ups = {c: _manifest(payload=bytes([c]) * 300, client=c, nonce=f"{c:02x}" * 16) for c in (0, 1)}
    headers = {c: sign_update(m, KEYS[c]) for c, (m, _) in ups.items()}
    v = _verifier()
    net = Network(NetworkConfig(**flat), 2, np.random.default_rng(0))
    res = net.transmit(3, ups, 1, np.random.default_rng(1), headers=headers, parent_digest=PARENT,
                       open_header=lambda c, h: v.open(c, h, round=3, parent_digest=PARENT))
    assert res.payloads == {0: b"\x00" * 300, 1: b"\x01" * 300} and not res.dropped
    assert res.bytes_on_wire == sum(len(h) for h in headers.values()) + 600
    assert res.headers == {0: [headers[0]], 1: [headers[1]]}
    # the same uploads with bare manifests: the difference on the wire is the signing overhead
    plain = Network(NetworkConfig(**flat), 2, np.random.default_rng(0)).transmit(
        3, ups, 1, np.random.default_rng(1), headers={c: m.to_json() for c, (m, _) in ups.items()})
    assert plain.payloads == res.payloads
    assert res.bytes_on_wire - plain.bytes_on_wire == sum(len(headers[c]) - len(ups[c][0].to_json()) for c in ups)


@settings(max_examples=25, deadline=None)
@given(pos=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_single_bit_flip_of_a_signed_header_is_refused(pos, bit):
    m, _ = _manifest()
    header = bytearray(sign_update(m, KEYS[0]))
    header[pos % len(header)] ^= 1 << bit
    with pytest.raises(HeaderRejected):
        _verifier().open(0, bytes(header), round=3, parent_digest=PARENT)


# ----------------------------------------------------------------------------- signed chunks in the trainer
@pytest.fixture(scope="module")
def plain_and_signed():
    plain = Federation(_scenario()).run()
    signed = Federation(_scenario(("signed_chunks", "mean"))).run()
    return plain, signed


def test_signing_changes_no_result_and_its_bytes_are_counted(plain_and_signed):
    plain, signed = plain_and_signed
    for p, s in zip(plain.records, signed.records):
        assert s.accuracy == p.accuracy and s.accepted == p.accepted and not s.rejected
        overhead = s.extra["signature_overhead_bytes"]
        assert overhead > 0 and s.bytes_on_wire - p.bytes_on_wire == overhead
        assert s.extra["header_bytes"] - p.extra["header_bytes"] == overhead
        # per client (5 chunks of 4096 B): the statement (~90 B per chunk subject + the predicate) in
        # base64 (×4/3), the 64-hex keyid, a 70–72 B DER signature in base64 and the JSON around them
        per_client = s.extra["header_bytes"] / 8
        assert 1200 < per_client < 1800, per_client
        assert s.extra["sign_s"] >= 0 and s.extra["verify_s"] >= 0


def test_a_signed_run_is_reproducible_byte_for_byte(plain_and_signed):
    _, signed = plain_and_signed
    again = Federation(_scenario(("signed_chunks", "mean"))).run()
    assert [(r.accuracy, r.bytes_on_wire, r.accepted) for r in again.records] == \
        [(r.accuracy, r.bytes_on_wire, r.accepted) for r in signed.records]


def test_signed_chunks_do_not_stop_an_honest_looking_poisoned_update():
    # the sender signs its own sign-flipped update: authentic, so every header verifies
    res = Federation(_scenario(("signed_chunks", "mean"), {"name": "sign_flip"}, rounds=1)).run()
    r = res.records[0]
    assert all(r.accepted) and r.rejected == {}


# ----------------------------------------------------------------------------- the provenance gate
GATE_CASES = [
    # attack, detected by the gate, the reason it gives
    ("unsigned_manifest", True, "provenance gate: unsigned manifest (no DSSE envelope)"),
    ("manifest_mismatch", True, "provenance gate: attestation: the shards trained on do not match the manifest: "
                                "shard 'y.i64': sha256 differs from the manifest"),
    ("label_flip", True, "provenance gate: attestation: the shards trained on do not match the manifest"),
    ("unenrolled_key", True, "provenance gate: signature is not by the client's enrolled key"),
    ("keyid_spoof", True, "provenance gate: signature is not by the client's enrolled key"),
    ("digest_downgrade", True, "provenance gate: manifest rejected: dataset manifest.subject[0].digest has md5: "
                               "sha256 is required (digest-algorithm downgrade?)"),
    ("log_fork", True, "provenance gate: log fork: the presented checkpoint for tree size 6"),
    ("stolen_key", False, None),  # correctly signed poisoned data: the gate cannot tell
]


@pytest.mark.parametrize("attack, detected, reason", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_each_provenance_attack_is_scored_as_expected(attack, detected, reason):
    fed = Federation(_scenario(("provenance_gate", "mean"), {"name": attack}))
    r = fed.run().records[0]
    honest = [c for c in range(8) if c not in fed.malicious]
    assert len(fed.malicious) == 2 and all(r.accepted[c] for c in honest)
    assert fed.admission.log_size == (6 if attack in ("unsigned_manifest", "keyid_spoof", "log_fork") else 8)
    if detected:
        assert sorted(fed.excluded) == fed.malicious
        for c in fed.malicious:
            assert fed.excluded[c].startswith(reason), fed.excluded[c]
            assert not r.accepted[c] and r.rejected[c] == fed.excluded[c]
    else:
        assert fed.excluded == {}
        assert all(r.accepted[c] and c not in r.rejected for c in fed.malicious)


def test_stolen_key_passes_the_gate_and_the_poisoned_labels_are_trained_on():
    sc = _scenario(("provenance_gate", "signed_chunks", "mean"), {"name": "stolen_key"})
    fed = Federation(sc)
    clean = Federation(sc, attack=dataclasses.replace(sc.attack, name="none"))
    assert fed.excluded == {} and clean.excluded == {}
    for c in fed.malicious:  # the labels it trains on are C − 1 − y of the clean ones
        assert fed.data.client(c).y.tolist() == [9 - y for y in clean.data.client(c).y.tolist()]
    r = fed.run().records[0]
    assert all(r.accepted) and r.rejected == {}  # and its updates are authentic: signing cannot help either


def test_log_fork_passes_a_gate_that_trusts_any_log_signed_checkpoint():
    fed = Federation(_scenario(({"name": "provenance_gate", "witness": False}, "mean"), {"name": "log_fork"}))
    assert fed.excluded == {}


def test_keyid_spoof_is_also_refused_by_the_log_itself():
    fed = Federation(_scenario(("provenance_gate", "mean"), {"name": "keyid_spoof"}))
    for c in fed.malicious:
        assert fed.admission.log_notes[c].endswith("keyid spoofing)")


def test_gate_admits_an_honest_federation_and_excluded_clients_stay_out():
    honest = Federation(_scenario(("provenance_gate", "mean")))
    assert honest.excluded == {} and honest.admission.log_size == 8
    assert honest.admission.manifest_bytes > 0 and honest.admission.time_s > 0
    fed = Federation(_scenario(("provenance_gate", "mean"), {"name": "label_flip"}, rounds=2))
    res = fed.run()
    assert res.records[0].extra["provenance_gate"]["excluded"] == fed.excluded
    for r in res.records:
        for c in fed.malicious:
            assert not r.accepted[c] and r.rejected[c].startswith("provenance gate: attestation")
            assert r.dropped[c] == r.rejected[c] and r.participating[c]
        assert sum(r.accepted) == 6
