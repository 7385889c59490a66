"""The dataset file readers (redteam.workloads.files) and `redteam data`, on tiny fabricated files.

Every file here is written by the test in tmp_path (a few dozen records per format), so nothing is
downloaded; `redteam data fetch` is only asked for --help and for an unknown name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from redteam.cli import main
from redteam.errors import InvalidParameter
from redteam.workloads import digests as D
from redteam.workloads import files as F

# ----------------------------------------------------------------------------- fabricators


def _cifar_record_pixels(i: int) -> np.ndarray:
    """A (3, 32, 32) image that says which record it is: red = i, green = row, blue = column."""
    img = np.zeros((3, 32, 32), dtype=np.uint8)
    img[0] = i
    img[1] = np.arange(32, dtype=np.uint8)[:, None]
    img[2] = np.arange(32, dtype=np.uint8)[None, :]
    return img


def _cifar_bytes(ids: list[int], labels: list[int], coarse: list[int] | None = None) -> bytes:
    out = bytearray()
    for k, (i, y) in enumerate(zip(ids, labels)):
        if coarse is not None:
            out.append(coarse[k])
        out.append(y)
        out += _cifar_record_pixels(i).tobytes()
    return bytes(out)


CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_cifar10(root: Path, per_batch: int = 3, test: int = 4) -> Path:
    """cifar-10-batches-bin/ under root: batch b holds records b*per_batch..; label = id % 10."""
    d = root / "cifar-10-batches-bin"
    d.mkdir(parents=True)
    for b in range(5):
        ids = list(range(b * per_batch, (b + 1) * per_batch))
        (d / f"data_batch_{b + 1}.bin").write_bytes(_cifar_bytes(ids, [i % 10 for i in ids]))
    ids = list(range(100, 100 + test))
    (d / "test_batch.bin").write_bytes(_cifar_bytes(ids, [i % 10 for i in ids]))
    (d / "batches.meta.txt").write_text("\n".join(CIFAR10_NAMES) + "\n\n")
    return d


def make_tar(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return archive


def make_cifar100(root: Path) -> Path:
    d = root / "cifar-100-binary"
    d.mkdir(parents=True)
    (d / "train.bin").write_bytes(_cifar_bytes(list(range(6)), [99, 0, 42, 7, 63, 1], [19, 0, 5, 3, 12, 0]))
    (d / "test.bin").write_bytes(_cifar_bytes([50, 51, 52], [3, 99, 50], [1, 19, 10]))
    return d


def _idx(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    return struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def _digit_images(n: int, seed: int) -> np.ndarray:
    """Asymmetric images: row r of image i holds i + r in column r only (an 'L' would do too),
    plus a marker at (0, 27) so a transpose shows."""
    x = np.zeros((n, 28, 28), dtype=np.uint8)
    for i in range(n):
        x[i, 0, 27] = 255
        x[i, 5, 1] = (seed + i) % 256
    return x


def make_idx(folder: Path, *, gz: bool, prefix: str = "", test_name: str = "t10k", transpose: bool = False,
             n_train: int = 12, n_test: int = 5, classes: int = 10) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_x": _digit_images(n_train, 1), "train_y": np.arange(n_train) % classes,
        "test_x": _digit_images(n_test, 7), "test_y": (np.arange(n_test) * 3) % classes,
    }
    for split, stem in (("train", "train"), ("test", test_name)):
        x = arrays[f"{split}_x"]
        stored = x.transpose(0, 2, 1) if transpose else x
        for kind, data in (("images-idx3", stored), ("labels-idx1", arrays[f"{split}_y"])):
            name = f"{prefix}{stem}-{kind}-ubyte"
            blob = _idx(data)
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(blob, mtime=0))
            else:
                (folder / name).write_bytes(blob)
    return arrays


def make_leaf_femnist(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, n_each in (("train", (3, 2, 4)), ("test", (1, 1, 1))):
        (root / split).mkdir(parents=True)
        for f, users in enumerate((["f0001_01", "f0002_02"], ["f0003_03"])):
            doc: dict = {"users": users, "num_samples": [], "user_data": {}}
            for u in users:
                k = n_each[int(u[4]) - 1]
                x = np.round(rng.random((k, 784)) * 255) / 255
                x[:, 0] = 1.0  # LEAF: background is 1.0
                y = [int(u[4]) * 10 + j for j in range(k)]
                doc["num_samples"].append(k)
                doc["user_data"][u] = {"x": x.tolist(), "y": y}
            (root / split / f"all_data_{f}_{split}.json").write_text(json.dumps(doc))
    return root


def make_leaf_shakespeare(root: Path, odd_char: str = "") -> Path:
    roles = {"KING_LEAR_KING": "The king is come. ", "HAMLET_HAMLET": "To be, or not to be:" + odd_char}
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        doc: dict = {"users": [], "num_samples": [], "user_data": {}, "hierarchies": []}
        for role, text in roles.items():
            line = " " * 80 + (text if split == "train" else text[::-1])
            xs = [line[i:i + 80] for i in range(len(line) - 80)]
            ys = [line[i + 80] for i in range(len(line) - 80)]
            doc["users"].append(role)
            doc["num_samples"].append(len(xs))
            doc["user_data"][role] = {"x": xs, "y": ys}
            doc["hierarchies"].append("play")
        (root / split / f"all_data_niid_0_{split}.json").write_text(json.dumps(doc))
    return root


PUBLISHED = dict(D.DATASETS)  # the real table, before any test changes it


def _unpublish(monkeypatch, *names: str) -> None:
    """Forget the published digests of ``names`` for this test."""
    for n in names:
        monkeypatch.setitem(D.DATASETS, n, D.DatasetInfo(n, "t", "x", "", ()))


@pytest.fixture(autouse=True)
def _fabricated_files_are_not_published(monkeypatch):
    """Our fabricated files carry the standard names, not the published bytes: every test starts
    with no published digests; a test about the real table puts entries back from PUBLISHED."""
    _unpublish(monkeypatch, *(n for n, i in PUBLISHED.items() if i.files))


def _republish(monkeypatch, *names: str) -> None:
    for n in names:
        monkeypatch.setitem(D.DATASETS, n, PUBLISHED[n])


def _redteam(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "redteam.cli", *args], capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------- CIFAR


def test_cifar10_folder_parent_and_archive_read_the_same(tmp_path, monkeypatch):
    folder = make_cifar10(tmp_path / "a")
    by_folder = F.read_cifar(folder, "cifar10")
    by_parent = F.read_cifar(tmp_path / "a", "cifar10")
    arch_dir = tmp_path / "b"
    arch_dir.mkdir()
    archive = make_tar(folder, arch_dir / "cifar-10-binary.tar.gz")
    by_archive = F.read_cifar(arch_dir, "cifar10")
    by_archive_file = F.read_cifar(archive)
    r = by_folder
    assert r.train_x.shape == (15, 3, 32, 32) and r.train_x.dtype.is_floating_point is False
    assert str(r.train_x.dtype) == "torch.uint8" and str(r.train_y.dtype) == "torch.int64"
    assert r.test_x.shape == (4, 3, 32, 32) and r.num_classes == 10
    # batches in order 1..5, record i has red = i, labels i % 10; channel 1 = row, channel 2 = column
    assert r.train_x[:, 0, 0, 0].tolist() == list(range(15))
    assert r.train_y.tolist() == [i % 10 for i in range(15)]
    assert r.test_y.tolist() == [0, 1, 2, 3]
    assert r.train_x[3, 1, 7, 0].item() == 7 and r.train_x[3, 2, 0, 9].item() == 9
    assert r.class_names == tuple(CIFAR10_NAMES) and r.name == "cifar10"
    assert r.groups is None
    for other in (by_parent, by_archive, by_archive_file):
        assert other.digest == r.digest  # the same data, whatever the packaging
        assert (other.train_x == r.train_x).all() and (other.test_y == r.test_y).all()
    assert set(r.files) == {f"data_batch_{i}.bin" for i in range(1, 6)} | {"test_batch.bin", "batches.meta.txt"}
    assert set(by_parent.files) == {"cifar-10-batches-bin/" + k for k in r.files}
    assert by_archive.files == {"cifar-10-binary.tar.gz": F.sha256_file(archive)}
    assert r.digest in r.source and "CIFAR-10 binary" in r.source


def test_cifar_digest_changes_with_one_byte(tmp_path):
    folder = make_cifar10(tmp_path)
    before = F.read_cifar(folder)
    f = folder / "data_batch_3.bin"
    raw = bytearray(f.read_bytes())
    raw[100] ^= 1
    f.write_bytes(bytes(raw))
    after = F.read_cifar(folder)
    assert after.digest != before.digest
    assert after.files["data_batch_3.bin"] != before.files["data_batch_3.bin"]
    assert after.files["data_batch_1.bin"] == before.files["data_batch_1.bin"]


def test_cifar100_uses_fine_labels(tmp_path):
    make_cifar100(tmp_path)
    r = F.read_cifar(tmp_path, "cifar100")
    assert r.num_classes == 100 and r.train_x.shape == (6, 3, 32, 32)
    assert r.train_y.tolist() == [99, 0, 42, 7, 63, 1] and r.test_y.tolist() == [3, 99, 50]
    assert r.test_x[1, 0, 0, 0].item() == 51


@pytest.mark.parametrize("damage,msg", [
    (lambda b: b[:-10], "not a whole number of 3073-byte records (1 label byte(s) + 3,072 pixels) (truncated?)"),
    (lambda b: bytes([12]) + b[1:], "record 0 has label 12, out of range [0, 10)"),
    (lambda b: b"", "0 bytes is not a whole number"),
])
def test_cifar_damaged_files_are_named(tmp_path, damage, msg):
    folder = make_cifar10(tmp_path)
    f = folder / "test_batch.bin"
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(InvalidParameter, match="test_batch.bin") as e:
        F.read_cifar(folder)
    assert msg in str(e.value)


def test_cifar_missing_batch_and_truncated_archive(tmp_path, monkeypatch):
    folder = make_cifar10(tmp_path / "a")
    archive = make_tar(folder, tmp_path / "cifar-10-binary.tar.gz")
    (folder / "data_batch_4.bin").unlink()
    with pytest.raises(InvalidParameter, match="missing data_batch_4.bin"):
        F.read_cifar(folder)
    cut = tmp_path / "cut" / "cifar-10-binary.tar.gz"
    cut.parent.mkdir()
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(InvalidParameter, match="truncated or damaged"):
        F.read_cifar(cut.parent)


def test_cifar_python_pickle_distribution_is_refused(tmp_path):
    py = tmp_path / "cifar-10-batches-py"
    py.mkdir()
    (py / "data_batch_1").write_bytes(b"\x80\x04K\x01.")  # a pickle; never loaded
    for where in (tmp_path, py):
        with pytest.raises(InvalidParameter, match="pickle") as e:
            F.read_cifar(where)
        assert "cifar-10-binary.tar.gz" in str(e.value) and "redteam data fetch cifar10" in str(e.value)
    arch = tmp_path / "cifar-100-python.tar.gz"
    arch.write_bytes(b"not read")
    with pytest.raises(InvalidParameter, match="never unpickles"):
        F.read_cifar(arch, "cifar100")


def test_archive_with_a_huge_member_header_is_refused(tmp_path, monkeypatch):
    folder = make_cifar10(tmp_path / "a")
    make_tar(folder, tmp_path / "cifar-10-binary.tar.gz")
    monkeypatch.setattr(F, "MAX_FILE_BYTES", 1000)
    with pytest.raises(InvalidParameter, match="declares .* bytes, more than the 1,000"):
        F.read_cifar(tmp_path)


def test_published_digest_mismatch_is_an_error(tmp_path, monkeypatch):
    folder = make_cifar10(tmp_path / "a")
    archive = make_tar(folder, tmp_path / "cifar-10-binary.tar.gz")
    real = F.sha256_file(archive)
    size = archive.stat().st_size
    wrong = "0" * 64
    monkeypatch.setitem(D.DATASETS, "cifar10", D.DatasetInfo(
        "cifar10", "t", "CIFAR binary", "", (), (D.Published("cifar-10-binary.tar.gz", "http://x", size, wrong, "test"),)))
    with pytest.raises(InvalidParameter) as e:
        F.read_cifar(tmp_path)
    msg = str(e.value)
    assert real in msg and wrong in msg and "cifar-10-binary.tar.gz" in msg and "redteam data fetch cifar10" in msg
    # the same table with the right digest accepts it
    monkeypatch.setitem(D.DATASETS, "cifar10", D.DatasetInfo(
        "cifar10", "t", "CIFAR binary", "", (), (D.Published("cifar-10-binary.tar.gz", "http://x", size, real, "test"),)))
    assert F.read_cifar(tmp_path).train_x.shape[0] == 15


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_plain_and_gzip(tmp_path, gz):
    arrays = make_idx(tmp_path, gz=gz)
    r = F.read_idx(tmp_path, "mnist")
    assert r.train_x.shape == (12, 1, 28, 28) and r.test_x.shape == (5, 1, 28, 28)
    assert (r.train_x[:, 0].numpy() == arrays["train_x"]).all()
    assert r.train_y.tolist() == arrays["train_y"].tolist() and r.test_y.tolist() == [0, 3, 6, 9, 2]
    assert r.class_names == tuple("0123456789") and r.num_classes == 10
    suffix = ".gz" if gz else ""
    assert set(r.files) == {f"{s}-{k}-ubyte{suffix}" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")}


def test_idx_digest_is_the_data_not_the_compression(tmp_path):
    make_idx(tmp_path / "gz", gz=True)
    make_idx(tmp_path / "plain", gz=False)
    a, b = F.read_idx(tmp_path / "gz"), F.read_idx(tmp_path / "plain")
    assert a.digest == b.digest and a.files != b.files
    f = tmp_path / "plain" / "t10k-labels-idx1-ubyte"
    raw = bytearray(f.read_bytes())
    raw[-1] = 1
    f.write_bytes(bytes(raw))
    assert F.read_idx(tmp_path / "plain").digest != a.digest


def test_idx_torchvision_layout_and_fashion_names(tmp_path):
    make_idx(tmp_path / "FashionMNIST" / "raw", gz=True)
    r = F.read_idx(tmp_path, "fashion_mnist")
    assert r.class_names[0] == "T-shirt/top" and r.name == "fashion_mnist"


def test_emnist_is_transposed_back_and_read_from_the_zip(tmp_path, monkeypatch):
    folder = tmp_path / "gzip"
    arrays = make_idx(folder, gz=True, prefix="emnist-balanced-", test_name="test", transpose=True, classes=47)
    (folder / "emnist-balanced-mapping.txt").write_text("".join(f"{i} {48 + i}\n" for i in range(47)))
    r = F.read_idx(tmp_path, "emnist_balanced")
    # stored transposed, returned upright: the marker is back at row 0, column 27
    assert (r.train_x[:, 0].numpy() == arrays["train_x"]).all()
    assert r.train_x[0, 0, 0, 27].item() == 255 and r.train_x[0, 0, 27, 0].item() == 0
    assert r.num_classes == 47 and r.class_names[:3] == ("0", "1", "2")
    # NIST's gzip.zip, read in place
    zdir = tmp_path / "z"
    zdir.mkdir()
    with zipfile.ZipFile(zdir / "gzip.zip", "w") as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"gzip/{f.name}")
    z = F.read_idx(zdir, "emnist_balanced")
    assert z.digest == r.digest and (z.train_x == r.train_x).all()
    assert list(z.files) == ["gzip.zip"] and z.class_names == r.class_names
    with pytest.raises(InvalidParameter, match="no member emnist-letters-train-images-idx3-ubyte.gz"):
        F.read_idx(zdir, "emnist_letters")


def _write_mnist_file(folder: Path, name: str, blob: bytes, gz: bool) -> None:
    (folder / (name + (".gz" if gz else ""))).write_bytes(gzip.compress(blob, mtime=0) if gz else blob)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("blob_of,msg", [
    (lambda good: good[:-7], "truncated"),
    (lambda good: b"\x00\x00\x09\x03" + good[4:], "IDX data type 0x09; expected 0x08 (unsigned byte)"),
    (lambda good: b"\x12\x34\x08\x03" + good[4:], "magic number 12340803 is not IDX"),
    (lambda good: b"\x00\x00\x08\x01" + good[4:], "declares 1 dimension(s); images (idx3) have 3"),
    (lambda good: good[:4] + struct.pack(">III", 100_000_000, 28, 28), "more than the"),
    (lambda good: good + b"\x00", "bytes after|9,425 bytes, but its header"),
    (lambda good: good[:4] + struct.pack(">I", 12) + struct.pack(">II", 32, 32) + bytes(12 * 32 * 32),
     "train images are 32×32; mnist images are 28×28"),
    (lambda good: good[:4] + struct.pack(">I", 11) + good[8:16] + good[16:16 + 11 * 784], "11 images but 12 labels"),
])
def test_idx_errors_say_what_is_wrong(tmp_path, gz, blob_of, msg):
    make_idx(tmp_path, gz=gz)
    name = "train-images-idx3-ubyte"
    good = gzip.decompress((tmp_path / (name + ".gz")).read_bytes()) if gz else (tmp_path / name).read_bytes()
    _write_mnist_file(tmp_path, name, blob_of(good), gz)
    with pytest.raises(InvalidParameter, match=msg.replace("(", r"\(").replace(")", r"\)")):
        F.read_idx(tmp_path, "mnist")


def test_idx_other_errors(tmp_path):
    make_idx(tmp_path, gz=True)
    f = tmp_path / "t10k-labels-idx1-ubyte.gz"
    f.write_bytes(f.read_bytes()[:-6])  # gzip stream cut short
    with pytest.raises(InvalidParameter, match="t10k-labels-idx1-ubyte.gz: not a complete gzip stream"):
        F.read_idx(tmp_path)
    f.write_bytes(gzip.compress(_idx(np.array([1, 2, 11, 0, 0], dtype=np.uint8))))
    with pytest.raises(InvalidParameter, match=r"test label 2 is 11, out of range \[0, 10\)"):
        F.read_idx(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(InvalidParameter, match="missing train-labels-idx1-ubyte"):
        F.read_idx(tmp_path)
    with pytest.raises(InvalidParameter, match="emnist_<split>"):
        F.read_idx(tmp_path, "emnist_nosuch")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidParameter, match="no IDX files"):
        F.read_idx(tmp_path / "empty", "fashion_mnist")


def test_idx_published_digest_mismatch(tmp_path, monkeypatch):
    _republish(monkeypatch, "mnist")
    make_idx(tmp_path, gz=True)
    f = tmp_path / "train-images-idx3-ubyte.gz"  # the first file read
    pub = D.published_for("mnist")["train-images-idx3-ubyte.gz"]  # the real MNIST's: our fabricated file differs
    with pytest.raises(InvalidParameter) as e:
        F.read_idx(tmp_path, "mnist")
    assert pub.sha256 in str(e.value) and F.sha256_file(f) in str(e.value) and str(f) in str(e.value)
    # a dataset without published digests for these names accepts them, and reports their digests
    monkeypatch.setitem(D.DATASETS, "mnist", D.DatasetInfo("mnist", "t", "IDX", "", ()))
    r = F.read_idx(tmp_path, "mnist")
    assert r.files["train-images-idx3-ubyte.gz"] == F.sha256_file(f)


# ----------------------------------------------------------------------------- LEAF


def test_leaf_femnist_groups_and_pixels(tmp_path):
    make_leaf_femnist(tmp_path / "femnist" / "data")
    r = F.read_leaf_femnist(tmp_path / "femnist")
    # train: file 0 users f0001 (3), f0002 (2); file 1 user f0003 (4); test: 1 each
    assert r.train_x.shape == (9, 1, 28, 28) and r.test_x.shape == (3, 1, 28, 28)
    assert r.group_names == ("f0001_01", "f0002_02", "f0003_03")
    assert r.groups.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2] and r.test_groups.tolist() == [0, 1, 2]
    assert r.train_y.tolist() == [10, 11, 12, 20, 21, 30, 31, 32, 33] and r.num_classes == 62
    assert (r.train_x[:, 0, 0, 0] == 255).all()
    doc = json.loads((tmp_path / "femnist/data/train/all_data_0_train.json").read_text())
    assert r.train_x[1, 0].flatten()[5].item() == round(doc["user_data"]["f0001_01"]["x"][1][5] * 255)
    assert set(r.files) == {"train/all_data_0_train.json", "train/all_data_1_train.json",
                            "test/all_data_0_test.json", "test/all_data_1_test.json"}
    assert r.class_names[10] == "A" and r.class_names[36] == "a"


def test_leaf_femnist_errors(tmp_path):
    root = make_leaf_femnist(tmp_path)
    f = root / "train" / "all_data_1_train.json"
    doc = json.loads(f.read_text())
    doc["num_samples"] = [5]
    f.write_text(json.dumps(doc))
    with pytest.raises(InvalidParameter, match="user 'f0003_03': 4 x, 4 y, num_samples 5"):
        F.read_leaf_femnist(root)
    doc["num_samples"] = [4]
    doc["user_data"]["f0003_03"]["x"][0] = doc["user_data"]["f0003_03"]["x"][0][:700]
    f.write_text(json.dumps(doc))
    with pytest.raises(InvalidParameter, match="x must be lists of 784 numbers"):
        F.read_leaf_femnist(root)
    f.write_text("{not json")
    with pytest.raises(InvalidParameter, match="all_data_1_train.json: not JSON"):
        F.read_leaf_femnist(root)
    with pytest.raises(InvalidParameter, match="expected LEAF's train/ and test/"):
        F.read_leaf_femnist(root / "train")


def test_leaf_shakespeare_ids_over_leafs_vocabulary(tmp_path):
    make_leaf_shakespeare(tmp_path)
    r = F.read_leaf_shakespeare(tmp_path)
    assert len(F.LEAF_LETTERS) == 80 and r.num_classes == 80 and r.vocab == F.LEAF_LETTERS
    n_lear, n_hamlet = len("The king is come. "), len("To be, or not to be:")
    assert r.train_x.shape == (n_lear + n_hamlet, 80) and str(r.train_x.dtype) == "torch.int64"
    assert r.group_names == ("KING_LEAR_KING", "HAMLET_HAMLET")
    assert r.groups.tolist() == [0] * n_lear + [1] * n_hamlet
    # the first target is 'T', after 80 spaces; the second window ends in 'T'
    assert r.train_y[0].item() == F.LEAF_LETTERS.index("T")
    assert (r.train_x[0] == F.LEAF_LETTERS.index(" ")).all()
    assert r.train_x[1, -1].item() == F.LEAF_LETTERS.index("T")
    decoded = "".join(F.LEAF_LETTERS[i] for i in r.train_y[:n_lear].tolist())
    assert decoded == "The king is come. " and r.unknown_symbols == 0


def test_leaf_shakespeare_unknown_symbols(tmp_path):
    make_leaf_shakespeare(tmp_path, odd_char="é")
    r = F.read_leaf_shakespeare(tmp_path)
    assert r.unknown_symbols > 0 and "unknown symbols" in r.source
    assert F.LEAF_LETTERS.index(" ") in r.train_y.tolist()
    with pytest.raises(InvalidParameter, match="outside LEAF's 80-symbol vocabulary, e.g. 'é'"):
        F.read_leaf_shakespeare(tmp_path, unknown="error")


# ----------------------------------------------------------------------------- text


def test_text_dir_reuses_the_corpus_digest(tmp_path):
    from redteam.workloads import corpus

    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("alpha beta\n", encoding="utf-8")
    (tmp_path / "b" / "c.txt").write_text("γάμμα\n", encoding="utf-8")
    (tmp_path / "skip.md").write_text("not text")
    r = F.read_text_dir(tmp_path)
    assert r.names == ("a.txt", "b/c.txt") and r.texts == ("alpha beta\n", "γάμμα\n")
    assert r.groups == ("a.txt", "b")
    assert r.digests[1] == hashlib.sha256("γάμμα\n".encode()).hexdigest()
    docs = r.documents()
    assert r.digest == corpus.digest(docs) and docs[1].data == "γάμμα\n".encode()
    (tmp_path / "bad.txt").write_bytes(b"ok\xff")
    with pytest.raises(InvalidParameter, match=r"bad.txt: not UTF-8 \(byte 2"):
        F.read_text_dir(tmp_path)


# ----------------------------------------------------------------------------- Hugging Face


def _png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _hf_split(pa, folder: Path, n: int, split: str, offset: int) -> None:
    folder.mkdir(parents=True)
    imgs = [np.full((4, 5), offset + i, dtype=np.uint8) for i in range(n)]
    table = pa.table({
        "img": pa.array([{"bytes": _png(a), "path": None} for a in imgs],
                        pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array([i % 3 for i in range(n)], pa.int64()),
        "text": pa.array([f"row {i}" for i in range(n)]),
        "vec": pa.array([[float(i), 2.0] for i in range(n)], pa.list_(pa.float32())),
    })
    with pa.ipc.new_stream(str(folder / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {
        "img": {"_type": "Image"}, "label": {"names": ["a", "b", "c"], "_type": "ClassLabel"},
        "text": {"dtype": "string", "_type": "Value"}, "vec": {"feature": {"dtype": "float32", "_type": "Value"},
                                                               "_type": "Sequence"}}}))
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                   "_fingerprint": "x", "_split": split}))


def test_hf_saved_dataset_dict(tmp_path):
    pa = pytest.importorskip("pyarrow")
    for split, n, off in (("train", 5, 0), ("test", 2, 100)):
        _hf_split(pa, tmp_path / split, n, split, off)
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    r = F.read_hf_saved(tmp_path)
    assert r.num_rows == {"train": 5, "test": 2}
    assert r.splits["train"]["label"].tolist() == [0, 1, 2, 0, 1]
    assert r.splits["train"]["text"][2] == "row 2" and r.splits["train"]["vec"].shape == (5, 2)
    assert r.class_names == {"label": ("a", "b", "c")}
    assert "test/data-00000-of-00001.arrow" in r.files
    im = r.image_files()
    assert im.train_x.shape == (5, 1, 4, 5) and im.test_x[1, 0, 0, 0].item() == 101 and im.num_classes == 3
    one = F.read_hf_saved(tmp_path / "train")  # a plain Dataset folder
    assert list(one.splits) == ["train"] and one.num_rows["train"] == 5
    state = json.loads((tmp_path / "train" / "state.json").read_text())
    state["_data_files"] = [{"filename": "../test/data-00000-of-00001.arrow"}]
    (tmp_path / "train" / "state.json").write_text(json.dumps(state))
    with pytest.raises(InvalidParameter, match="not a plain .arrow file name"):
        F.read_hf_saved(tmp_path)


def test_hf_saved_without_pyarrow_is_one_clear_line(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(InvalidParameter, match="needs pyarrow: pip install pyarrow"):
        F.read_hf_saved(tmp_path)


# ----------------------------------------------------------------------------- redteam data


def test_data_check_fabricated_folders(tmp_path, capsys, monkeypatch):
    _republish(monkeypatch, "mnist", "fashion_mnist", "cifar100")
    make_cifar10(tmp_path / "cifar")
    make_idx(tmp_path / "mnist", gz=True)
    assert main(["data", "check", str(tmp_path / "cifar"), "--read"]) == 0
    out = capsys.readouterr().out
    assert "cifar10" in out and "unknown" in out and "data_batch_1.bin" in out and "train (15, 3, 32, 32)" in out
    # our fabricated .gz files carry MNIST's and Fashion-MNIST's published names, not their bytes
    assert main(["data", "check", str(tmp_path / "mnist")]) == 1
    out = capsys.readouterr().out
    assert "mismatch" in out and "neither mnist's nor fashion_mnist's" in out
    assert main(["data", "check", str(tmp_path / "mnist"), "--name", "mnist"]) == 1
    assert "expected 440fcabf" in capsys.readouterr().out
    # with the published table naming our files, the same folder is ok and recognised as mnist
    pubs = tuple(D.Published(f.name, "http://x", f.stat().st_size, F.sha256_file(f), "test")
                 for f in sorted((tmp_path / "mnist").iterdir()))
    monkeypatch.setitem(D.DATASETS, "mnist", D.DatasetInfo("mnist", "t", "IDX", "", (), pubs))
    assert main(["data", "check", str(tmp_path / "mnist"), "--read"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") >= 4 and "read: MNIST" in out
    # nothing recognisable: non-zero, saying what was expected
    (tmp_path / "empty").mkdir()
    assert main(["data", "check", str(tmp_path / "empty")]) == 1
    assert "expected" in capsys.readouterr().err
    assert main(["data", "check", str(tmp_path / "cifar"), "--name", "cifar100"]) == 1
    assert "cifar-100-binary" in capsys.readouterr().err


def test_data_check_refuses_pickle_and_finds_leaf(tmp_path, capsys):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    assert main(["data", "check", str(tmp_path)]) == 1
    assert "refused" in capsys.readouterr().out
    make_leaf_shakespeare(tmp_path / "leaf" / "data")
    assert main(["data", "check", str(tmp_path / "leaf"), "--read"]) == 0
    out = capsys.readouterr().out
    assert "leaf_shakespeare" in out and "read: LEAF Shakespeare" in out


def test_data_check_emnist_zip_and_text(tmp_path, capsys):
    folder = tmp_path / "src"
    make_idx(folder, gz=True, prefix="emnist-digits-", test_name="test", transpose=True)
    with zipfile.ZipFile(tmp_path / "gzip.zip", "w") as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"gzip/{f.name}")
    (tmp_path / "notes.txt").write_text("a corpus of one\n")
    assert main(["data", "check", str(tmp_path / "gzip.zip"), "--name", "emnist_digits", "--read"]) == 0
    out = capsys.readouterr().out
    assert "gzip.zip" in out and "read: EMNIST digits (gzip.zip; 12 train + 5 test)" in out
    assert main(["data", "check", str(tmp_path), "--name", "text", "--read"]) == 0
    out = capsys.readouterr().out
    assert "notes.txt" in out and "read: text folder" in out


def test_data_check_reads_the_header_of_an_idx_file_without_a_published_digest(tmp_path, capsys):
    """issue 40 §5: an IDX-named file with no published digest (EMNIST's extracted files, a
    decompressed MNIST file) was "unknown", exit 0, whatever its bytes. Its header is read: a real
    IDX file stays "unknown" (accepted, exit 0); one that is not IDX, or whose size disagrees with
    its header, is "invalid" (exit 1). A path with nothing recognisable is an error like any other."""
    make_idx(tmp_path / "e", gz=False, prefix="emnist-digits-", test_name="test")
    assert main(["data", "check", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    assert "4 unknown" in out and "invalid" not in out
    images = tmp_path / "e" / "emnist-digits-train-images-idx3-ubyte"
    good = images.read_bytes()
    images.write_bytes(good[:-1])  # one byte short: the header declares more
    assert main(["data", "check", str(tmp_path / "e")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 invalid, 3 unknown" in out and f"but its header (12×28×28) declares {len(good):,} (truncated)" in out
    images.write_bytes(b"\x7c\x45" + good[2:])
    assert main(["data", "check", str(images)]) == 1
    assert "magic number 7c450803 is not IDX" in " ".join(capsys.readouterr().out.split())
    other = tmp_path / "notes.bin"
    other.write_bytes(b"not a dataset")
    assert main(["data", "check", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"redteam: error: data check: {other}: no dataset files found; expected ")


def test_data_cli_help_list_and_fetch_without_network(tmp_path, monkeypatch):
    _republish(monkeypatch, "cifar10")
    proc = _redteam("data", "--help")
    assert proc.returncode == 0 and "redteam data check DIR" in proc.stdout
    proc = _redteam("data", "fetch", "--help")
    assert proc.returncode == 0 and ".part" in proc.stdout and "SHA-256" in proc.stdout
    proc = _redteam("data", "check", "--help")
    assert proc.returncode == 0 and "mismatch" in proc.stdout
    proc = _redteam("data", "list")
    assert proc.returncode == 0
    for name in ("cifar10", "fashion_mnist", "leaf_shakespeare"):
        assert name in proc.stdout
    assert D.published_for("cifar10")["cifar-10-binary.tar.gz"].sha256 in proc.stdout

    import urllib.request

    def no_network(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("the network was used")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert main(["data", "fetch", "imagenet", "--dir", str(tmp_path / "d")]) == 2
    assert main(["data", "fetch", "leaf_femnist", "--dir", str(tmp_path / "d")]) == 2
    assert not (tmp_path / "d").exists()
    proc = _redteam("data", "fetch", "imagenet", "--dir", str(tmp_path / "d"))
    assert proc.returncode == 2 and "not a known dataset" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_fetch_resumes_verifies_and_renames(tmp_path, monkeypatch):
    """fetch() with a fake urlopen: a .part is resumed with a Range request, checked, renamed."""
    from redteam import data_cli

    payload = bytes(range(256)) * 40
    pub = D.Published("blob.bin", "http://example.invalid/blob.bin", len(payload),
                      hashlib.sha256(payload).hexdigest(), "test")
    monkeypatch.setitem(D.DATASETS, "toy", D.DatasetInfo("toy", "t", "x", "", (), (pub,)))
    seen = []

    class Resp(io.BytesIO):
        def __init__(self, data, status):
            super().__init__(data)
            self.status = status

    def fake_urlopen(req, timeout):
        rng = req.get_header("Range")
        seen.append(rng)
        start = int(rng.split("=")[1].rstrip("-")) if rng else 0
        return Resp(payload[start:], 206 if rng else 200)

    (tmp_path / "blob.bin.part").write_bytes(payload[:1000])
    done = data_cli.fetch("toy", tmp_path, progress=False, urlopen=fake_urlopen)
    assert done == [(tmp_path / "blob.bin", "downloaded")] and seen == ["bytes=1000-"]
    assert (tmp_path / "blob.bin").read_bytes() == payload and not (tmp_path / "blob.bin.part").exists()
    assert data_cli.fetch("toy", tmp_path, progress=False, urlopen=fake_urlopen)[0][1] == "verified"
    # a download that does not match is deleted, not renamed
    (tmp_path / "blob.bin").unlink()
    bad = D.Published("blob.bin", pub.url, pub.size, "f" * 64, "test")
    monkeypatch.setitem(D.DATASETS, "toy", D.DatasetInfo("toy", "t", "x", "", (), (bad,)))
    with pytest.raises(InvalidParameter, match="the download was deleted"):
        data_cli.fetch("toy", tmp_path, progress=False, urlopen=fake_urlopen)
    assert not list(tmp_path.iterdir())



@pytest.mark.parametrize("planted", ["symlink", "dangling symlink", "hard link"])
def test_fetch_never_writes_through_a_planted_part_file(tmp_path, monkeypatch, capsys, planted):
    """A FILE.part planted as a link to another file: before, fetch resumed (appended to)
    or truncated the link's target; now it is refused in one line and the target, the link
    and the server are left alone."""
    payload = bytes(range(256)) * 40
    pub = D.Published("blob.bin", "http://example.invalid/blob.bin", len(payload),
                      hashlib.sha256(payload).hexdigest(), "test")
    monkeypatch.setitem(D.DATASETS, "toy", D.DatasetInfo("toy", "t", "x", "", (), (pub,)))
    import urllib.request

    asked = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda req, timeout: asked.append(req) or io.BytesIO(payload))
    victim = tmp_path / "victim.txt"
    dest = tmp_path / "d"
    dest.mkdir()
    part = dest / "blob.bin.part"
    if planted == "hard link":
        victim.write_bytes(b"precious")
        os.link(victim, part)
    else:
        if planted == "symlink":
            victim.write_bytes(b"precious")
        part.symlink_to(victim)
    assert main(["data", "fetch", "toy", "--dir", str(dest), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blob.bin.part" in err[0] and "link" in err[0], err
    assert asked == [] and not (dest / "blob.bin").exists()
    if planted == "dangling symlink":
        assert not victim.exists() and part.is_symlink()
    else:
        assert victim.read_bytes() == b"precious" and os.path.lexists(part)

def test_published_table_is_well_formed():
    assert {n for n, i in PUBLISHED.items() if i.files} == {"mnist", "fashion_mnist", "emnist", "cifar10", "cifar100"}
    for info in PUBLISHED.values():
        for p in info.files:
            assert len(p.sha256) == 64 and int(p.sha256, 16) >= 0 and p.size > 0
            assert p.url.startswith(("http://", "https://")) and p.url.endswith(p.name) and "TFDS" in p.source


# ------------------------------------------------------- recompressed copies, system directories


def _pin(monkeypatch, folder: Path, name: str = "fashion_mnist", content_of: Path | None = None) -> None:
    """Publish ``folder``'s four .gz files under ``name`` with digests that are *not* theirs (as if
    the publisher's compression differed), pinning the decompressed content of ``content_of``'s
    files (default: their own)."""
    src = content_of or folder
    pubs = []
    for f in sorted(folder.glob("*.gz")):
        raw = gzip.decompress((src / f.name).read_bytes())
        pubs.append(D.Published(f.name, "https://example.invalid/" + f.name, f.stat().st_size + 24, "0" * 64, "test",
                                hashlib.sha256(raw).hexdigest(), len(raw)))
    monkeypatch.setitem(D.DATASETS, name, D.DatasetInfo(name, "t", "IDX", "", (), tuple(pubs)))


def test_a_recompressed_copy_of_the_published_content_verifies_and_a_changed_one_does_not(tmp_path, monkeypatch):
    # Debian recompressed Fashion-MNIST: the .gz bytes differ from the published ones while the
    # decompressed IDX content is the same. The content digest accepts that copy, and only it.
    same = tmp_path / "same"
    make_idx(same, gz=True)
    _pin(monkeypatch, same)
    assert F.read_idx(same, "fashion_mnist").num_classes == 10  # .gz digests all differ: content decides
    changed = tmp_path / "changed"
    make_idx(changed, gz=True)
    blob = gzip.decompress((changed / "t10k-labels-idx1-ubyte.gz").read_bytes())
    (changed / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(blob[:-1] + bytes([(blob[-1] + 1) % 10]),
                                                                      compresslevel=1))
    _pin(monkeypatch, changed, content_of=same)
    with pytest.raises(InvalidParameter, match=r"t10k-labels-idx1-ubyte\.gz.*decompressed content is not the pinned"):
        F.read_idx(changed, "fashion_mnist")
    # the second path: `redteam data check` says ok for the recompressed copy, mismatch for the changed one
    pubs = D.published_for("fashion_mnist")
    f = changed / "train-labels-idx1-ubyte.gz"
    assert F.matches_published(f, pubs[f.name], F.sha256_file(f), f.stat().st_size) == (
        True, "a recompressed copy: its decompressed content is the published content")
    f = changed / "t10k-labels-idx1-ubyte.gz"
    assert F.matches_published(f, pubs[f.name], F.sha256_file(f), f.stat().st_size) == (False, "")


def test_the_content_digest_reads_no_more_than_the_pinned_length(tmp_path):
    big = tmp_path / "big.gz"
    big.write_bytes(gzip.compress(b"\0" * 5000))
    assert F.gz_content_sha256(big, limit=4999) is None  # a gzip bomb stops at the pinned length + 1
    assert F.gz_content_sha256(big)[1] == 5000
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    assert F.gz_content_sha256(tmp_path / "bad.gz") is None


def test_data_dir_falls_back_to_a_system_package_and_the_environment_wins_when_it_has_the_data(tmp_path, monkeypatch):
    from redteam.requirements import DATA_DIR_ENV, data_dir_for, unmet

    system = tmp_path / "usr-share-datasets-fashion-mnist"
    monkeypatch.setitem(D.SYSTEM_DIRS, "fashion_mnist", (str(tmp_path / "absent"), str(system)))
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert data_dir_for("fashion_mnist") is None  # neither exists
    assert unmet(["dataset:fashion_mnist"]) != []
    system.mkdir()
    assert data_dir_for("fashion_mnist") == system and unmet(["dataset:fashion_mnist"]) == []
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    assert data_dir_for("fashion_mnist") == system  # $REDTEAM_DATA_DIR/fashion_mnist is not there
    (tmp_path / "data" / "fashion_mnist").mkdir(parents=True)
    assert data_dir_for("fashion_mnist") == tmp_path / "data" / "fashion_mnist"
    assert data_dir_for("fashion_mnist", {"dir": "given"}) == Path("given")
    assert data_dir_for("mnist") == tmp_path / "data" / "mnist"  # no system package: the env path, named


DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed "
                                                         "(.ci/run installs it: apt-get install dataset-fashion-mnist)")
def test_fmnist_reads_debians_recompressed_package_against_the_pinned_content(monkeypatch):
    _republish(monkeypatch, "fashion_mnist")
    from redteam.registry import WORKLOADS
    from redteam.requirements import DATA_DIR_ENV

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    ds = WORKLOADS.create("fmnist", {}).load(0)
    assert tuple(ds.train_x.shape) == (60000, 1, 28, 28) and tuple(ds.test_x.shape) == (10000, 1, 28, 28)
    assert np.bincount(ds.train_y.numpy()).tolist() == [6000] * 10  # Fashion-MNIST's balanced classes
    r = _redteam("data", "check", str(DEBIAN_FASHION))
    assert r.returncode == 0 and "4 ok" in r.stdout and "recompressed copy" in r.stdout, r.stdout + r.stderr
    with pytest.raises(InvalidParameter, match='is "fashion_mnist" here'):
        WORKLOADS.create("fmnist", {"variant": "mnist"})
