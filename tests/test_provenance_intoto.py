"""in-toto Statement v1: builder, strict parser, the hot-path serializer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from provenance import _codec
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.intoto import STATEMENT_TYPE, Statement, digest_matches, statement_json

HEX = "0123456789abcdef" * 4


def test_layout_by_hand():
    s = Statement.build({"a.bin": HEX}, "https://example.org/p/v1", {"k": 1})
    assert s.to_json() == (b'{"_type":"https://in-toto.io/Statement/v1","predicate":{"k":1},'
                           b'"predicateType":"https://example.org/p/v1",'
                           b'"subject":[{"digest":{"sha256":"' + HEX.encode() + b'"},"name":"a.bin"}]}')
    assert STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert Statement.from_json(s.to_json()) == s


@given(st.text(max_size=30), st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
       st.sampled_from(["https://x/v1", "https://redteam.dev/chunk/v1", 'quote"type']))
def test_statement_json_is_byte_identical_to_the_builder(name, predicate, ptype):
    built = Statement.build([(name, HEX)], ptype, predicate).to_json()
    assert statement_json(name, HEX, ptype, _codec.dumps(predicate)) == built
    assert Statement.from_json(built).predicate == predicate


@pytest.mark.parametrize("doc,msg", [
    ({"_type": "https://in-toto.io/Statement/v0.1", "subject": [], "predicateType": "x"}, "_type"),
    ({"_type": STATEMENT_TYPE, "subject": [], "predicateType": "x"}, "non-empty list"),
    ({"_type": STATEMENT_TYPE, "subject": [{"name": "a"}], "predicateType": "x"}, "missing field 'digest'"),
    ({"_type": STATEMENT_TYPE, "subject": [{"digest": {"sha256": HEX.upper()}}], "predicateType": "x"}, "lowercase hex"),
    ({"_type": STATEMENT_TYPE, "subject": [{"digest": {"sha256": HEX[:-2]}}], "predicateType": "x"}, "length 64"),
    ({"_type": STATEMENT_TYPE, "subject": [{"digest": {"sha256": HEX}}], "predicateType": ""}, "must not be empty"),
    ({"_type": STATEMENT_TYPE, "subject": [{"digest": {"sha256": HEX}}], "predicateType": "x", "predicate": []},
     "predicate: expected a JSON object"),
    ({"_type": STATEMENT_TYPE, "subject": [{"digest": {"sha256": HEX}, "nam": "a"}], "predicateType": "x"},
     "unexpected field nam"),
])
def test_malformed_statements(doc, msg):
    with pytest.raises(ProvenanceError, match=msg):
        Statement.from_json(json.dumps(doc))


def test_digest_matching_needs_sha256_not_any_algorithm():
    s = Statement.from_json(json.dumps({"_type": STATEMENT_TYPE, "predicateType": "x",
                                        "subject": [{"name": "a", "digest": {"sha256": HEX, "md5": HEX[:32]}}]}))
    assert digest_matches(s.subject("a"), HEX)
    assert not digest_matches(s.subject("a"), HEX[:32])
    with pytest.raises(VerificationFailed, match="no subject named 'b'"):
        s.subject("b")
    with pytest.raises(ProvenanceError, match="64 lowercase hex"):
        Statement.build({"a": "xyz"}, "t")
