"""The papers' datasets as workloads (issue 20 §2–3), on fabricated files: every loader, the
natural partition, and a two-round federation each; requirements and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import redteam.workloads.digests as D
from redteam.errors import InvalidParameter
from redteam.federation.loop import Federation
from redteam.registry import WORKLOADS
from redteam.scenario import parse_scenario
from redteam.workloads import paper
from test_data_files import make_cifar10, make_idx, make_leaf_femnist, make_leaf_shakespeare


@pytest.fixture(autouse=True)
def _fabricated(monkeypatch):
    """Fabricated files carry the standard names, not the published bytes."""
    for n in list(D.DATASETS):
        monkeypatch.setitem(D.DATASETS, n, D.DatasetInfo(n, "t", "x", "", ()))
    paper._read.cache_clear()


def _fed(workload, *, partition="iid", clients=3, rounds=2, attack="none", **fed):
    doc = {"scenario": {"seed": 1}, "workload": workload,
           "federation": {"clients": clients, "rounds": rounds, "local_steps": 2, "batch_size": 2, "partition": partition,
                          "malicious_fraction": 0.34 if attack != "none" else 0.0, "min_samples": 1, **fed},
           "attack": attack, "defense": "mean"}
    return Federation(parse_scenario(doc))


def test_cifar10_workload_trains_two_rounds(tmp_path):
    make_cifar10(tmp_path, per_batch=4)
    fed = _fed({"name": "cifar10", "dir": str(tmp_path), "width": 4, "test_limit": 0})
    assert fed.data.x.shape[1:] == (3, 32, 32) and int(fed.data.sizes.sum()) + 0 <= 20
    res = fed.run()
    assert len(res.records) == 2 and not torch.equal(fed.final_params, fed.params0)
    assert fed.spec.dim > 1000  # a (narrow) ResNet-18


def test_cifar_standardize_and_limits(tmp_path):
    make_cifar10(tmp_path, per_batch=4)
    w = WORKLOADS.create("cifar10", {"dir": str(tmp_path), "train_limit": 10, "test_limit": 2})
    ds = w.load(0)
    assert ds.train_x.shape == (10, 3, 32, 32) and ds.test_x.shape[0] == 2
    m = ds.train_x.mean(dim=(0, 2, 3))
    assert torch.allclose(m, torch.zeros(3), atol=1e-5)  # per-channel standardised on the training images
    assert "sha256" in ds.source or len(ds.source) > 10


def _backdoor_run(tmp_path, malicious_fraction):
    """Three clients on the fabricated CIFAR (20 training images, 20 test), one of them (or none)
    stamping every eligible image with 5.0 on pixels (31, 31) and (31, 30) of all three channels,
    labelled 7. The clean runs' models never predict 7 on the triggered test images (seeds 1..5:
    ASR 0.0 after 3 rounds); the attacked runs' always do (1.0)."""
    if not (tmp_path / "cifar-10-batches-bin").exists():
        make_cifar10(tmp_path, per_batch=4, test=20)
    backdoor = {"name": "backdoor", "image_shape": [3, 32, 32], "trigger": [[31, 31], [31, 30]], "fraction": 1.0,
                "value": 5.0, "target": 7}
    doc = {"scenario": {"seed": 1}, "workload": {"name": "cifar10", "dir": str(tmp_path), "model": "lenet5"},
           "federation": {"clients": 3, "rounds": 3, "local_steps": 5, "batch_size": 4, "partition": "iid", "lr": 0.05,
                          "malicious_fraction": malicious_fraction, "min_samples": 1},
           "attack": backdoor, "defense": "mean"}
    fed = Federation(parse_scenario(doc))
    return fed, fed.run()


def test_cifar_backdoor_on_images(tmp_path):
    """A pixel backdoor addresses CIFAR's 3×32×32 pixels (image_shape): the ASR probe is the test
    images whose class is not 7, stamped on exactly the two trigger pixels of every channel and
    labelled 7; the ASR is the share of them the model calls 7 (checked against the model's own
    predictions), and the attack moves it from 0 to 1 against the same run without an attacker."""
    from torch.func import functional_call

    fed, res = _backdoor_run(tmp_path, 0.34)
    ds = WORKLOADS.create("cifar10", {"dir": str(tmp_path), "model": "lenet5"}).load(0)
    x, y = fed.probes.targeted
    keep = ds.test_y != 7
    assert torch.equal(y, torch.full((int(keep.sum()),), 7)) and x.shape == (int(keep.sum()), 3, 32, 32)
    mask = torch.zeros(3, 32, 32, dtype=torch.bool)
    mask[:, 31, 31] = mask[:, 31, 30] = True
    assert torch.all(x[:, mask] == 5.0)
    assert torch.equal(x[:, ~mask], ds.test_x[keep][:, ~mask])  # nothing else changed
    asr = [r.extra["asr"] for r in res.records]
    assert all(0.0 <= a <= 1.0 for a in asr)
    out = functional_call(fed.setup.model, fed.spec.unflatten(fed.final_params), (x,))
    assert asr[-1] == pytest.approx(float((out.argmax(dim=1) == 7).double().mean()))
    _, clean = _backdoor_run(tmp_path, 0.0)
    assert clean.records[-1].extra["asr"] == 0.0 and asr[-1] == 1.0


def _learnable_idx(folder, n_train=60, n_test=30):
    """IDX files whose class k is a bright 10×4 bar at its own place on a noisy background."""
    import gzip

    from test_data_files import _idx

    folder.mkdir(parents=True)
    written = {}
    for stem, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        rng = np.random.default_rng(seed)
        y = (np.arange(n) * 7) % 10
        x = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, k in enumerate(y):
            r, c = 2 + 12 * (k // 5), 2 + 5 * (k % 5)
            x[i, r:r + 10, c:c + 4] = 255
        (folder / f"{stem}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(x), mtime=0))
        (folder / f"{stem}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(y), mtime=0))
        written[stem] = (x, y)
    return written


@pytest.mark.parametrize("model", ["lenet5", "cnn2", "mlp"])
def test_mnist_idx_workload(tmp_path, model):
    """The IDX files load with their labels in order and their images in (1, 28, 28) (the bar of
    class k where it was written), and three rounds of three clients learn them: the test accuracy
    ends at ≥ 0.5 against 0.1 for the majority class (each class is a tenth of the test set)."""
    written = _learnable_idx(tmp_path / "mnist")
    ds = WORKLOADS.create("mnist", {"dir": str(tmp_path / "mnist"), "model": model}).load(0)
    assert ds.train_y.tolist() == written["train"][1].tolist() and ds.test_y.tolist() == written["t10k"][1].tolist()
    assert ds.train_x.shape == (60, 1, 28, 28) and ds.test_x.shape == (30, 1, 28, 28)
    bright = ds.train_x[1, 0] > ds.train_x[1, 0].mean() + 1.0  # class 7: rows 14..23, columns 12..15
    assert written["train"][1][1] == 7 and bright[14:24, 12:16].all() and bright.sum() == 40
    doc = {"scenario": {"seed": 1}, "workload": {"name": "mnist", "dir": str(tmp_path / "mnist"), "model": model},
           "federation": {"clients": 3, "rounds": 3, "local_steps": 5, "batch_size": 8, "partition": "iid", "lr": 0.1,
                          "min_samples": 1}, "attack": "none", "defense": "mean"}
    fed = Federation(parse_scenario(doc))
    assert fed.data.x.shape[1:] == (1, 28, 28)
    majority = np.bincount(written["t10k"][1]).max() / len(written["t10k"][1])
    assert majority == pytest.approx(0.1) and fed.run().records[-1].accuracy >= 0.5


def test_femnist_natural_partition_is_by_writer(tmp_path):
    make_leaf_femnist(tmp_path)
    fed = _fed({"name": "femnist", "dir": str(tmp_path)}, partition="natural", clients=3)
    # three writers with 3, 2 and 4 training samples: one writer a client
    assert sorted(fed.data.sizes.tolist()) == [2, 3, 4]
    for c in range(3):
        ys = fed.data.client(c).y.tolist()
        assert len({y // 10 for y in ys}) == 1  # labels 10·w + j: a single writer w per client
    fed.run()


def test_natural_partition_needs_groups(tmp_path):
    make_cifar10(tmp_path, per_batch=4)
    with pytest.raises(InvalidParameter, match="no natural partition"):
        _fed({"name": "cifar10", "dir": str(tmp_path), "width": 4}, partition="natural")


def test_shakespeare_char_lstm(tmp_path):
    make_leaf_shakespeare(tmp_path)
    fed = _fed({"name": "shakespeare", "dir": str(tmp_path), "hidden": 8, "layers": 1}, partition="natural", clients=2)
    assert fed.data.x.dtype == torch.int64 and fed.data.x.shape[1] == 80
    res = fed.run()
    assert 0.0 <= res.records[-1].accuracy <= 1.0


def test_missing_directory_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    with pytest.raises(InvalidParameter, match="REDTEAM_DATA_DIR"):
        WORKLOADS.create("cifar10", {}).load(0)
    monkeypatch.setenv("REDTEAM_DATA_DIR", str(tmp_path))
    (tmp_path / "cifar10").mkdir()
    with pytest.raises(InvalidParameter):
        WORKLOADS.create("cifar10", {}).load(0)


def test_bad_parameters():
    with pytest.raises(InvalidParameter, match="variant"):
        WORKLOADS.create("mnist", {"variant": "kmnist"})
    with pytest.raises(InvalidParameter, match="train_limit"):
        WORKLOADS.create("cifar10", {"train_limit": -1})


def test_stratified_subset_is_fixed_and_balanced():
    y = torch.arange(1000) % 10
    a = paper._subset(y, 100, 3)
    assert torch.equal(a, paper._subset(y, 100, 3)) and len(set(a.tolist())) == 100
    assert np.bincount(y[a].numpy(), minlength=10).tolist() == [10] * 10


PAPER_SCENARIOS = ["literature/karimireddy_mnist.toml", "literature/karimireddy_exp3_mnist.toml",
                   "literature/backfed_cifar10.toml",
                   "literature/backfed_cifar10_defenses.toml", "literature/backfed_emnist.toml",
                   "literature/flpoison_cifar10.toml"]


@pytest.mark.parametrize("name", PAPER_SCENARIOS)
def test_published_table_scenarios_load_and_say_what_they_need(name, monkeypatch):
    """Every cell validates (plugins instantiated), and without the data the reason is named."""
    from pathlib import Path

    from redteam.requirements import unmet
    from redteam.matrix import load_matrix

    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    base, matrix, _ = load_matrix(Path(__file__).parent.parent / "scenarios" / name)
    assert matrix.cells and base.scenario.requires
    missing = unmet(base.scenario.requires, base.workload.params)
    assert any("needs dataset" in m for m in missing)


def test_text_workload_reads_a_hugging_face_folder(tmp_path):
    """A save_to_disk folder as the language model's corpus: each row of the column a document."""
    pa = pytest.importorskip("pyarrow")
    import json

    texts = [f"document number {i}: " + "the quick brown fox jumps over the lazy dog. " * 3 for i in range(12)]
    table = pa.table({"text": pa.array(texts), "n": pa.array(list(range(12)), pa.int64())})
    with pa.ipc.new_stream(str(tmp_path / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table)
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                     "_split": "train"}))
    w = WORKLOADS.create("text", {"hf_dir": str(tmp_path), "context": 16, "width": 16, "heads": 2, "layers": 1})
    ds = w.load(0)
    assert ds.train_x.shape[1] == 16 and "hf_dir" in ds.source and ds.num_classes == 256
    assert len(set(ds.groups.tolist())) > 1  # one group per row: by_group can deal them
    with pytest.raises(InvalidParameter, match="columns"):
        WORKLOADS.create("text", {"hf_dir": str(tmp_path), "hf_column": "body"}).load(0)
    with pytest.raises(InvalidParameter, match="strings"):
        WORKLOADS.create("text", {"hf_dir": str(tmp_path), "hf_column": "n"}).load(0)
    with pytest.raises(InvalidParameter, match="not both"):
        WORKLOADS.create("text", {"hf_dir": str(tmp_path), "text_dir": str(tmp_path)})


def test_pixel_attacks_take_the_workloads_image_shape(tmp_path):
    """A backdoor (alone or in a composition) that leaves image_shape unset addresses CIFAR's
    3×32×32 images, not digits' 8×8 default."""
    make_cifar10(tmp_path, per_batch=4)
    for attack in ({"name": "backdoor"},
                   {"name": "compose", "attacks": [{"name": "backdoor"}, {"name": "model_replacement"}]}):
        fed = _fed({"name": "cifar10", "dir": str(tmp_path), "model": "lenet5"}, attack=attack)
        assert fed.attack.image_shape == (3, 32, 32) if attack["name"] == "backdoor" else True
        res = fed.run()
        assert "asr" in res.records[-1].extra
