"""Hostile dataset files (issue 35 §2, §3, §8, §9): every reader refuses in one line what would
read out of bounds, crash, or allocate past the stated budget (``REDTEAM_MAX_DATA_BYTES``).

The memory cases run the reader in a child process under a hard address-space limit
(``RLIMIT_AS``): before the fixes each of them ran out of memory there (or read far more than
the budget); now each is refused, by an estimate made before the allocation. Every hostile file
is written here, most of them as gzip members of zeros concatenated (a few MB on disk).
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from redteam.cli import main
from redteam.errors import InvalidParameter
from redteam.workloads import digests as D
from redteam.workloads import files as F

from test_data_files import PUBLISHED, _hf_split, make_idx, make_leaf_femnist

MiB = 1 << 20
LINUX = sys.platform.startswith("linux") and Path("/proc/self/status").is_file()


@pytest.fixture(autouse=True)
def _nothing_published(monkeypatch):
    for n, i in PUBLISHED.items():
        if i.files:
            monkeypatch.setitem(D.DATASETS, n, D.DatasetInfo(n, "t", "x", "", ()))


_ZEROS_GZ = gzip.compress(b"\0" * MiB, compresslevel=1, mtime=0)


def _gz_zeros(n: int) -> bytes:
    """A gzip stream (concatenated members) of ``n`` zero bytes, about 1 KB per MiB."""
    full, rest = divmod(n, MiB)
    return _ZEROS_GZ * full + gzip.compress(b"\0" * rest, mtime=0)


def _under_cap(code: str, budget: int = 64 * MiB, headroom: int = 256 * MiB, env: dict | None = None,
               prelude: str = "pass") -> subprocess.CompletedProcess:
    """Run ``code`` (a reader call) in a child process whose address space may grow by
    ``headroom`` bytes only (after the imports and ``prelude``), with ``REDTEAM_MAX_DATA_BYTES =
    budget``. It prints REFUSED and the message (exit 3) on InvalidParameter, READ when the
    reader returned."""
    prog = textwrap.dedent("""\
        import resource, sys
        import numpy
        import redteam.workloads.files as F
        from redteam.errors import InvalidParameter
        try:
            import pyarrow, pyarrow.ipc
        except ImportError:
            pass
        PRELUDE
        vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + HEADROOM, vm + HEADROOM))
        try:
            CODE
        except InvalidParameter as exc:
            print("REFUSED", exc)
            sys.exit(3)
        print("READ")
        """).replace("HEADROOM", str(headroom)).replace("PRELUDE", prelude).replace("CODE", code)
    e = {**os.environ, "REDTEAM_MAX_DATA_BYTES": str(budget), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
         "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **(env or {})}
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, env=e)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 3 and len(out) == 1 and out[0].startswith("REFUSED"), proc.stdout + proc.stderr[-2000:]
    for w in words:
        assert w in out[0], out[0]


needs_linux = pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc/self/status: Linux only")


# ----------------------------------------------------------------------------- §3 memory bombs


@needs_linux
def test_a_small_tar_gz_of_large_members_is_refused_before_they_are_read(tmp_path):
    """A 6-member .tar.gz of a few hundred KB whose members, each under the per-file cap, add up
    to more than the budget: members are counted from their headers as they stream."""
    records = 13_000  # 40 MB a member, 240 MB in all
    size = records * 3073
    out = b""
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
        info.size = size
        out += gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT), mtime=0)
        out += _gz_zeros(size + (-size) % 512)
    out += gzip.compress(b"\0" * 1024, mtime=0)
    arch = tmp_path / "cifar10-copy.tar.gz"  # another name: the published digest does not stop it first
    arch.write_bytes(out)
    assert arch.stat().st_size < 2 * MiB
    _refused(_under_cap(f"F.read_cifar({str(arch)!r})", budget=128 * MiB), "REDTEAM_MAX_DATA_BYTES", "data_batch")


@needs_linux
def test_a_cifar_folder_of_large_sparse_batches_is_refused_before_reading(tmp_path):
    d = tmp_path / "cifar-10-batches-bin"
    d.mkdir()
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        with (d / name).open("wb") as f:
            f.truncate(13_000 * 3073)  # sparse: 40 MB each, no disk used
    _refused(_under_cap(f"F.read_cifar({str(d)!r})", budget=128 * MiB), "REDTEAM_MAX_DATA_BYTES")


@needs_linux
def test_gzipped_idx_files_declaring_large_images_are_refused_before_decompressing(tmp_path):
    """Two small .gz files whose headers declare 100 MB of images each (under the per-file cap):
    the declared dimensions are charged against the budget before the data is decompressed."""
    n = 130_000
    for stem, count in (("emnist-digits-train", n), ("emnist-digits-test", n)):
        head = struct.pack(">BBBB3I", 0, 0, 8, 3, count, 28, 28)
        (tmp_path / f"{stem}-images-idx3-ubyte.gz").write_bytes(gzip.compress(head, mtime=0) + _gz_zeros(count * 784))
        (tmp_path / f"{stem}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress(struct.pack(">BBBBI", 0, 0, 8, 1, count), mtime=0) + _gz_zeros(count))
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) < 1 * MiB
    _refused(_under_cap(f"F.read_idx({str(tmp_path)!r}, 'emnist_digits')", budget=128 * MiB),
             "REDTEAM_MAX_DATA_BYTES", "test-images")


def test_idx_dimensions_are_checked_before_the_data_is_read(tmp_path):
    """A header declaring 1000×1000 images is refused from its header (not after reading 1 GB)."""
    make_idx(tmp_path, gz=True)
    head = struct.pack(">BBBB3I", 0, 0, 8, 3, 12, 1000, 1000)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(head, mtime=0))  # no data at all
    with pytest.raises(InvalidParameter, match="train images are 1000×1000; mnist images are 28×28"):
        F.read_idx(tmp_path, "mnist")


@needs_linux
def test_a_leaf_json_that_parses_to_many_times_its_size_is_refused_before_parsing(tmp_path):
    make_leaf_femnist(tmp_path)
    n = 5_000_000  # 15 MB of "[]," parse to about 400 MB of empty lists
    body = '{"users": ["u"], "num_samples": [%d], "user_data": {"u": {"x": [%s[]], "y": [%s0]}}}' % (
        n, "[]," * (n - 1), "0," * (n - 1))
    (tmp_path / "train" / "all_data_0_train.json").write_text(body)
    _refused(_under_cap(f"F.read_leaf_femnist({str(tmp_path)!r})", budget=128 * MiB),
             "REDTEAM_MAX_DATA_BYTES", "all_data_0_train.json")


def test_leaf_budget_counts_what_is_kept(tmp_path, monkeypatch):
    """The budget is one figure for the whole read: a small one refuses even the tiny files, and
    the default reads them."""
    make_leaf_femnist(tmp_path)
    assert F.read_leaf_femnist(tmp_path).train_x.shape[0] == 9
    monkeypatch.setenv("REDTEAM_MAX_DATA_BYTES", "20000")
    with pytest.raises(InvalidParameter, match="REDTEAM_MAX_DATA_BYTES"):
        F.read_leaf_femnist(tmp_path)
    monkeypatch.setenv("REDTEAM_MAX_DATA_BYTES", "lots")
    with pytest.raises(InvalidParameter, match="REDTEAM_MAX_DATA_BYTES"):
        F.read_leaf_femnist(tmp_path)


@needs_linux
def test_a_large_dataset_info_json_is_refused_before_parsing(tmp_path):
    pa = pytest.importorskip("pyarrow")
    _hf_split(pa, tmp_path / "train", 3, "train", 0)
    (tmp_path / "train" / "dataset_info.json").write_text('{"features": {}, "x": [%s[]]}' % ("[]," * 6_000_000))
    _refused(_under_cap(f"F.read_hf_saved({str(tmp_path / 'train')!r})", budget=1 << 30), "dataset_info.json")


@needs_linux
def test_an_arrow_file_listed_many_times_is_read_once_or_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    d = tmp_path / "train"
    _hf_split(pa, d, 3, "train", 0)
    t = pa.table({"blob": pa.array([b"\1" * MiB] * 4, pa.binary())})
    with pa.ipc.new_stream(str(d / "data-00000-of-00001.arrow"), t.schema) as w:
        w.write_table(t)
    (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}] * 2000,
                                              "_split": "train"}))
    _refused(_under_cap(f"F.read_hf_saved({str(d)!r})", budget=1 << 30), "data-00000-of-00001.arrow", "twice")


def _zero_binary_table(pa, rows: int, width: int):
    data = pa.py_buffer(bytes(rows * width))
    offsets = pa.py_buffer(np.arange(rows + 1, dtype=np.int32).tobytes() if width == 0 else
                           (np.arange(rows + 1, dtype=np.int64) * width).astype(np.int32).tobytes())
    return pa.table({"blob": pa.Array.from_buffers(pa.binary(), rows, [None, offsets, data])})


@needs_linux
def test_a_compressed_arrow_file_is_capped_by_its_decompressed_size(tmp_path):
    """§2: a small zstd .arrow file decompressing to 200 MB is refused from its batch metadata,
    before anything is decompressed: the cap counts decompressed bytes, not the file's."""
    pa = pytest.importorskip("pyarrow")
    d = tmp_path / "train"
    d.mkdir()
    t = _zero_binary_table(pa, 200, MiB)
    with pa.ipc.new_stream(str(d / "data-00000-of-00001.arrow"), t.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(t)
    del t
    assert (d / "data-00000-of-00001.arrow").stat().st_size < 1 * MiB
    _refused(_under_cap(f"F.read_hf_saved({str(d)!r})", budget=64 * MiB), "REDTEAM_MAX_DATA_BYTES", "decompress")


def test_a_compressed_arrow_file_within_the_budget_reads(tmp_path):
    pa = pytest.importorskip("pyarrow")
    d = tmp_path / "train"
    d.mkdir()
    t = pa.table({"text": pa.array([f"row {i}" for i in range(1000)]), "label": pa.array(range(1000))})
    for codec in ("zstd", "lz4"):
        with pa.ipc.new_stream(str(d / "data-00000-of-00001.arrow"), t.schema,
                               options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
            w.write_table(t, max_chunksize=300)
        r = F.read_hf_saved(d)
        assert r.splits["train"]["text"][999] == "row 999" and r.splits["train"]["label"].sum() == 499500
    with pa.ipc.new_file(str(d / "data-00000-of-00001.arrow"), t.schema) as w:  # the IPC file format
        w.write_table(t)
    assert F.read_hf_saved(d).num_rows == {"train": 1000}


def _arrow_with_bad_offsets(pa, path: Path) -> None:
    t = pa.table({"text": pa.array(["abc", "defgh", "ij"])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    raw = bytearray(sink.getvalue().to_pybytes())
    good = struct.pack("<4i", 0, 3, 8, 10)
    at = bytes(raw).find(good)
    assert at > 0 and bytes(raw).find(good, at + 1) < 0
    raw[at:at + 16] = struct.pack("<4i", 0, 3, 0x7FFF0000, 10)  # a string reaching 2 GB past the buffer
    path.write_bytes(bytes(raw))


def test_an_arrow_file_with_crafted_string_offsets_is_refused(tmp_path):
    """§2: the batch is validated fully (offsets within the data buffer) before any value is
    read; in a child process, since the unvalidated read may crash the interpreter."""
    pa = pytest.importorskip("pyarrow")
    d = tmp_path / "train"
    d.mkdir()
    _arrow_with_bad_offsets(pa, d / "data-00000-of-00001.arrow")
    proc = _under_cap(f"F.read_hf_saved({str(d)!r})", budget=1 << 30, headroom=1 << 30)
    _refused(proc, "data-00000-of-00001.arrow", "not a valid Arrow", "out of bounds")


def test_hf_images_are_charged_before_decoding(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    for split, n, off in (("train", 5, 0), ("test", 2, 100)):
        _hf_split(pa, tmp_path / split, n, split, off)
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    r = F.read_hf_saved(tmp_path)
    assert r.image_files().train_x.shape == (5, 1, 4, 5)
    monkeypatch.setattr(F, "_IMAGE_PIXELS", 10)  # the per-image cap counts pixels × channels
    with pytest.raises(InvalidParameter, match=r"row 0: a 5×4 image .* too large"):
        r.image_files()


# ----------------------------------------------------------------------------- §8, §9


def test_size_matching_with_a_different_digest_is_a_mismatch(tmp_path, capsys, monkeypatch):
    """§8: a file of the published size whose SHA-256 differs is a mismatch, for `data check`,
    for matches_published and for the reader (the size alone never makes a file ok)."""
    make_idx(tmp_path, gz=True)
    f = tmp_path / "t10k-labels-idx1-ubyte.gz"
    pub = D.Published(f.name, "http://x/" + f.name, f.stat().st_size, "0" * 64, "test")
    monkeypatch.setitem(D.DATASETS, "mnist", D.DatasetInfo("mnist", "t", "IDX", "", (), (pub,)))
    assert F.matches_published(f, pub, F.sha256_file(f), f.stat().st_size) == (False, "")
    assert main(["data", "check", str(tmp_path), "--name", "mnist"]) == 1
    out = capsys.readouterr().out
    assert "mismatch" in out and " ok" not in out
    with pytest.raises(InvalidParameter, match="is not the published"):
        F.read_idx(tmp_path, "mnist")


@pytest.mark.parametrize("line,msg", [("-1 65", "label -1"), ("10 65", "label 10"), ("3 1114112", "code 1114112"),
                                      ("3", "is not 'label ascii-code'")])
def test_emnist_mapping_labels_outside_the_classes_are_refused(tmp_path, line, msg):
    """§9: a mapping label of -1 named the last class (Python's negative index); 10 was an
    IndexError traceback."""
    make_idx(tmp_path, gz=True, prefix="emnist-digits-", test_name="test", transpose=True)
    (tmp_path / "emnist-digits-mapping.txt").write_text("0 48\n1 49\n" + line + "\n")
    with pytest.raises(InvalidParameter, match="emnist-digits-mapping.txt") as e:
        F.read_idx(tmp_path, "emnist_digits")
    assert msg in str(e.value)


def test_a_leaf_pixel_of_4000_digits_is_one_line(tmp_path):
    """§8: an integer too large for a float was an OverflowError traceback."""
    make_leaf_femnist(tmp_path)
    doc = json.loads((tmp_path / "train" / "all_data_0_train.json").read_text())
    u = doc["users"][0]
    text = json.dumps(doc).replace(json.dumps(doc["user_data"][u]["x"][0][:1])[1:-1], "1" + "0" * 3999, 1)
    (tmp_path / "train" / "all_data_0_train.json").write_text(text)
    with pytest.raises(InvalidParameter, match="pixel values must be"):
        F.read_leaf_femnist(tmp_path)


def _deep(root: Path, depth: int) -> Path:
    """A chain of ``depth`` one-letter folders under root (made with relative mkdir calls: the
    full path may be longer than the system allows at once)."""
    d = root
    for _ in range(depth):
        d = d / "d"
    fd = os.open(root, os.O_RDONLY)
    try:
        for i in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        with open(os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("text at the bottom of a deep folder\n")
    finally:
        os.close(fd)
    return d


def _rm_deep(root: Path) -> None:
    """Remove what :func:`_deep` made, bottom up and without recursion (shutil.rmtree and
    pytest's clean-up of old temporary folders recurse once per level)."""
    fds = [os.open(root, os.O_RDONLY)]
    try:
        while "d" in os.listdir(fds[-1]):
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
        os.unlink("deep.txt", dir_fd=fds[-1])
        for parent in reversed(fds[:-1]):
            os.close(fds.pop())
            os.rmdir("d", dir_fd=parent)
    finally:
        for fd in fds:
            os.close(fd)


def test_text_folders_are_walked_without_recursion(tmp_path, capsys):
    """§8: a 1,200-deep folder was a RecursionError in read_text_dir and in text_dir's listing."""
    from redteam.workloads import corpus

    root = tmp_path / "t"
    root.mkdir()
    (root / "top.txt").write_text("a document at the top\n")
    _deep(root, 1200)
    try:
        try:
            r = F.read_text_dir(root)
            assert len(r.names) == 2
        except InvalidParameter as exc:  # a path longer than the system allows: one line
            assert "cannot" in str(exc)
        try:
            assert len(corpus.directory_documents(root)) == 2
        except InvalidParameter as exc:
            assert "cannot" in str(exc)
    finally:
        _rm_deep(root)


def test_data_check_read_caps_a_text_folder(tmp_path, capsys, monkeypatch):
    """§8: `data check --read` read every .txt under the folder, however many and however large."""
    for i in range(6):
        (tmp_path / f"doc{i}.txt").write_text("some words. " * 50)
    monkeypatch.setenv("REDTEAM_MAX_TEXT_FILES", "5")
    assert main(["data", "check", str(tmp_path), "--name", "text", "--read"]) == 1
    out = capsys.readouterr().out
    assert "read: ERROR" in out and "more than 5 files" in out and "REDTEAM_MAX_TEXT_FILES" in out
    monkeypatch.setenv("REDTEAM_MAX_TEXT_FILES", "100")
    monkeypatch.setenv("REDTEAM_MAX_TEXT_BYTES", "2000")
    assert main(["data", "check", str(tmp_path), "--name", "text", "--read"]) == 1
    assert "REDTEAM_MAX_TEXT_BYTES" in capsys.readouterr().out
    monkeypatch.delenv("REDTEAM_MAX_TEXT_BYTES")
    assert main(["data", "check", str(tmp_path), "--name", "text", "--read"]) == 0


@pytest.mark.parametrize("workload,key", [("text", "hf_dir"), ("cifar10", "dir"), ("mnist", "dir"),
                                          ("femnist", "dir")])
def test_data_directories_outside_the_scenario_are_refused_like_text_dir(tmp_path, capsys, monkeypatch,
                                                                         workload, key):
    """§9: hf_dir and the dataset dir were not confined as text_dir is."""
    from redteam.scenario import load_scenario

    outside = tmp_path / "home" / "data"
    outside.mkdir(parents=True)
    work = tmp_path / "work"
    (work / "scen").mkdir(parents=True)
    p = work / "scen" / "t.toml"
    p.write_text(f'[workload]\nname = "{workload}"\n{key} = "{outside}"\n'
                 '[federation]\nclients = 2\nrounds = 1\npartition = "iid"\n')
    monkeypatch.chdir(work)
    assert main(["run", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"[workload].{key}" in err[0] and "REDTEAM_ALLOW_DATA_DIR_OUTSIDE" in err[0], err
    (work / "scen" / "data").mkdir()
    p.write_text(p.read_text().replace(str(outside), "data"))  # inside the scenario's directory: accepted
    assert load_scenario(p).workload.params[key] == "data"
    p.write_text(p.read_text().replace('"data"', f'"{outside}"'))
    monkeypatch.setenv("REDTEAM_ALLOW_DATA_DIR_OUTSIDE", "1")
    assert load_scenario(p).workload.params[key] == str(outside)


@needs_linux
def test_a_safetensors_file_with_a_large_extra_tensor_is_refused_from_its_header(tmp_path):
    """§3: start_from loaded every tensor, an extra one of 300 MB included, before comparing the
    names with the model's; the names, shapes and dtypes are now checked from the header, and
    only the model's tensors are loaded. The file is sparse: its header declares the tensor."""
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "extra": {"dtype": "U8", "shape": [300 * MiB], "data_offsets": [24, 24 + 300 * MiB]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    f = tmp_path / "m.safetensors"
    with f.open("wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + np.ones(6, np.float32).tobytes())
        out.truncate(8 + len(text) + 24 + 300 * MiB)
    prelude = ("from redteam.federation.params import ParamSpec; "
               "from redteam.federation.warmup import load_model_file; "
               "from pathlib import Path; import torch, safetensors.torch")
    code = f"load_model_file(Path({str(f)!r}), ParamSpec(('w',), ((2, 3),), (6,)))"
    _refused(_under_cap(code, headroom=200 * MiB, prelude=prelude), "not in the model: extra")
