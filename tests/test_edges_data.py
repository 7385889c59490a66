"""The data loaders' edges (issue 39, survivors of an outside mutation audit), each a worked
example: ``redteam data check`` refuses a substituted file of the published size; a Hugging Face
colour image (encoded, and as an array with a declared channel count) keeps its H × W when H ≠ W;
an IDX label equal to the class count is out of range; LEAF's FEMNIST pixels are round(255·x),
not truncated."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest

from redteam.cli import main
from redteam.errors import InvalidParameter
from redteam.workloads import digests as D
from redteam.workloads import files as F
from redteam.workloads.files import _images_of


def _idx(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return head + arr.tobytes()


def _mnist(folder: Path, train_y: list[int]) -> None:
    """Four gzipped IDX files: len(train_y) blank training images with those labels, 2 test images."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"train-images-idx3-ubyte": np.zeros((len(train_y), 28, 28)), "train-labels-idx1-ubyte": train_y,
             "t10k-images-idx3-ubyte": np.zeros((2, 28, 28)), "t10k-labels-idx1-ubyte": [0, 1]}
    for name, a in parts.items():
        (folder / f"{name}.gz").write_bytes(gzip.compress(_idx(np.asarray(a)), mtime=0))


@pytest.fixture(autouse=True)
def _no_published(monkeypatch):
    """Fabricated files carry the standard names, not the published bytes: forget the real table."""
    for n, info in dict(D.DATASETS).items():
        if info.files:
            monkeypatch.setitem(D.DATASETS, n, D.DatasetInfo(n, "t", "x", "", ()))


# ----------------------------------------------------------------------------- data check


def test_data_check_refuses_a_same_size_file_with_another_digest(tmp_path, capsys, monkeypatch):
    """The table publishes our four files; one is then replaced by a file of exactly its size with
    one byte changed. Size alone must not pass it: `data check` says mismatch and exits 1."""
    _mnist(tmp_path, [0, 1, 2])
    pubs = tuple(D.Published(f.name, "http://x", f.stat().st_size, F.sha256_file(f), "test")
                 for f in sorted(tmp_path.iterdir()))
    monkeypatch.setitem(D.DATASETS, "mnist", D.DatasetInfo("mnist", "t", "IDX", "", (), pubs))
    assert main(["data", "check", str(tmp_path), "--name", "mnist"]) == 0
    capsys.readouterr()
    f = tmp_path / "train-labels-idx1-ubyte.gz"
    blob = bytearray(f.read_bytes())
    blob[-9] ^= 0xFF  # inside the deflate stream: same length, other bytes
    f.write_bytes(bytes(blob))
    pub = next(p for p in pubs if p.name == f.name)
    assert f.stat().st_size == pub.size and F.sha256_file(f) != pub.sha256
    assert F.matches_published(f, pub, F.sha256_file(f), f.stat().st_size) == (False, "")
    assert main(["data", "check", str(tmp_path), "--name", "mnist"]) == 1
    out = capsys.readouterr().out
    assert "mismatch" in out and f"expected {pub.sha256}" in out


# ----------------------------------------------------------------------------- Hugging Face


def _rgb(h: int, w: int) -> np.ndarray:
    """(h, w, 3): red = 10·row, green = 10·column, blue = 7: every pixel says where it is."""
    r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return np.stack([10 * r, 10 * c, np.full((h, w), 7)], axis=-1).astype(np.uint8)


def test_hf_encoded_colour_image_keeps_height_and_width():
    from PIL import Image

    img = _rgb(4, 5)  # 4 rows, 5 columns
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    out = _images_of([{"bytes": buf.getvalue(), "path": None}], "t")
    assert out.shape == (1, 3, 4, 5)
    assert out[0, 0, 3, 1] == 30 and out[0, 1, 3, 1] == 10 and out[0, 2, 3, 1] == 7  # row 3, column 1
    assert np.array_equal(out[0], img.transpose(2, 0, 1))


@pytest.mark.parametrize("channels", [None, 3])
def test_hf_colour_array_keeps_height_and_width(channels):
    a = np.stack([_rgb(4, 5), _rgb(4, 5) + 1])  # (2, 4, 5, 3), channels last
    out = _images_of(a, "t", channels=channels)
    assert out.shape == (2, 3, 4, 5)
    assert out[1, 0, 3, 1] == 31 and out[1, 1, 3, 1] == 11 and out[0, 1, 0, 4] == 40


# ----------------------------------------------------------------------------- IDX


def test_idx_label_equal_to_the_class_count_is_out_of_range(tmp_path):
    """MNIST has classes 0..9: a label 9 is read, a label 10 (= num_classes) is refused by name."""
    _mnist(tmp_path / "ok", [0, 9, 3])
    r = F.read_idx(tmp_path / "ok", "mnist")
    assert r.train_y.tolist() == [0, 9, 3] and r.num_classes == 10
    _mnist(tmp_path / "bad", [0, 10, 3])
    with pytest.raises(InvalidParameter, match=r"train label 1 is 10, out of range \[0, 10\)"):
        F.read_idx(tmp_path / "bad", "mnist")


# ----------------------------------------------------------------------------- LEAF


def test_leaf_femnist_pixels_round_to_the_nearest_level(tmp_path):
    """LEAF stores x = pixel / 255 as a float: every level k / 255 (whose product with 255 may land
    just under k) reads back as k, and values between levels round to the nearest: 0.003 → 0.765
    → 1, 0.999 → 254.745 → 255, 0.5 → 127.5 → 128 (half to even), 0.3 → 76.5 → 76."""
    x = np.zeros(784)
    x[:256] = np.arange(256) / 255
    x[256:260] = [0.003, 0.999, 0.5, 0.3]
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        doc = {"users": ["f0001_01"], "num_samples": [1], "user_data": {"f0001_01": {"x": [x.tolist()], "y": [3]}}}
        (tmp_path / split / f"all_data_0_{split}.json").write_text(json.dumps(doc))
    px = F.read_leaf_femnist(tmp_path).train_x[0, 0].flatten().tolist()
    assert px[:256] == list(range(256))
    assert px[256:260] == [1, 255, 128, 76]
