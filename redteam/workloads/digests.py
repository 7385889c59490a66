"""The published SHA-256 digests (and sizes) of the standard dataset files, and where each was found.

Every digest of a published file below was copied from a source that publishes it, named in the
comment above the entry; none was computed here or guessed. A ``.gz`` file may also carry the
SHA-256 of its *decompressed content* (``content_sha256``), so that a recompressed copy of the
same data (Debian's ``dataset-fashion-mnist`` package recompressed Zalando's files) verifies and a
changed one does not; where no source publishes that digest, the comment says how it was derived. A file that a source does not list has no entry: the
readers (:mod:`redteam.workloads.files`) accept such a file and report its digest, and reject a
file whose name has an entry here when its size or SHA-256 differs.

Sources:

* **TFDS**: TensorFlow Datasets' download checksums, ``tensorflow_datasets/url_checksums/<name>.txt``
  in the ``tensorflow/datasets`` repository (one line per download: URL, size in bytes, SHA-256).
  TFDS computes them from the files at those URLs and refuses a download that differs.

Not covered: the members of the CIFAR archives and of the EMNIST zip (no source publishes their
SHA-256; an extracted folder is read and its files' digests reported, the archive is what can be
checked), the decompressed MNIST IDX files (the ``.gz`` files are published), LEAF's JSON (generated
on the user's machine by LEAF's scripts, with a random sample of writers), a Hugging Face
``save_to_disk`` folder and a text folder (the user's own).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Published", "DatasetInfo", "DATASETS", "EMNIST_SPLITS", "SYSTEM_DIRS", "published_for", "dataset_info"]


@dataclass(frozen=True, slots=True)
class Published:
    """One file as its publisher distributes it: its name, address, size and SHA-256, and the
    source that lists the digest."""

    name: str
    url: str
    size: int
    sha256: str
    source: str
    content_sha256: str = ""  # of the decompressed bytes of a .gz ("": not pinned)
    content_size: int = 0


@dataclass(frozen=True, slots=True)
class DatasetInfo:
    """A dataset ``redteam data`` knows: what it is, its on-disk format, the files a reader
    reads (``expected``), and the published files that ``redteam data fetch`` downloads."""

    name: str
    title: str
    format: str
    homepage: str
    expected: tuple[str, ...]
    files: tuple[Published, ...] = ()
    note: str = ""


_TFDS = "TFDS url_checksums/{}.txt (tensorflow/datasets)"

# MNIST: TFDS url_checksums/mnist.txt. TFDS downloads the files from Google's CVDF mirror, the
# same files as LeCun's page (http://yann.lecun.com/exdb/mnist/), which no longer serves them
# reliably.
_MNIST_BASE = "https://storage.googleapis.com/cvdf-datasets/mnist/"
_MNIST = (
    Published("train-images-idx3-ubyte.gz", _MNIST_BASE + "train-images-idx3-ubyte.gz", 9912422,
              "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", _TFDS.format("mnist")),
    Published("train-labels-idx1-ubyte.gz", _MNIST_BASE + "train-labels-idx1-ubyte.gz", 28881,
              "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", _TFDS.format("mnist")),
    Published("t10k-images-idx3-ubyte.gz", _MNIST_BASE + "t10k-images-idx3-ubyte.gz", 1648877,
              "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", _TFDS.format("mnist")),
    Published("t10k-labels-idx1-ubyte.gz", _MNIST_BASE + "t10k-labels-idx1-ubyte.gz", 4542,
              "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", _TFDS.format("mnist")),
)

# Fashion-MNIST: TFDS url_checksums/fashion_mnist.txt (Zalando's own S3 site; the same files as
# github.com/zalandoresearch/fashion-mnist, whose README lists their MD5s). The content digests
# (SHA-256 of the decompressed IDX bytes) were derived here, not copied: the two label files from
# the .gz files committed in zalandoresearch/fashion-mnist (data/fashion/, at commit 55506a9),
# whose SHA-256 equal TFDS's above; the two image files, which that repository keeps outside git's
# reach here, by decompressing Debian's package dataset-fashion-mnist 0.0~git20200523.55506a9-1,
# built from the same commit (Debian recompressed all four files; its two label files decompress
# to exactly the upstream content).
_FASHION_BASE = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_FASHION = (
    Published("train-images-idx3-ubyte.gz", _FASHION_BASE + "train-images-idx3-ubyte.gz", 26421880,
              "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84", _TFDS.format("fashion_mnist"),
              "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888", 47040016),
    Published("train-labels-idx1-ubyte.gz", _FASHION_BASE + "train-labels-idx1-ubyte.gz", 29515,
              "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845", _TFDS.format("fashion_mnist"),
              "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9", 60008),
    Published("t10k-images-idx3-ubyte.gz", _FASHION_BASE + "t10k-images-idx3-ubyte.gz", 4422102,
              "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073", _TFDS.format("fashion_mnist"),
              "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b", 7840016),
    Published("t10k-labels-idx1-ubyte.gz", _FASHION_BASE + "t10k-labels-idx1-ubyte.gz", 5148,
              "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5", _TFDS.format("fashion_mnist"),
              "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34", 10008),
)

#: where operating-system packages install a dataset (read when neither ``dir`` nor
#: ``$REDTEAM_DATA_DIR`` names one): Debian's dataset-fashion-mnist
SYSTEM_DIRS: dict[str, tuple[str, ...]] = {
    "fashion_mnist": ("/usr/share/datasets/fashion-mnist",),
}

# CIFAR-10 / CIFAR-100, the binary distributions: TFDS url_checksums/cifar10.txt and cifar100.txt.
_CIFAR10 = (
    Published("cifar-10-binary.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", 170052171,
              "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd", _TFDS.format("cifar10")),
)
_CIFAR100 = (
    Published("cifar-100-binary.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz", 168513733,
              "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec", _TFDS.format("cifar100")),
)

# EMNIST: TFDS url_checksums/emnist.txt lists the zip of all splits (IDX, gzipped) at NIST's old
# address http://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/gzip.zip; NIST now serves the same
# file (same size and SHA-256) from biometrics.nist.gov, the address below.
_EMNIST = (
    Published("gzip.zip", "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip", 561753746,
              "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e", _TFDS.format("emnist")),
)

#: EMNIST's six splits and their classes (Cohen, Afshar, Tapson & van Schaik, "EMNIST: an
#: extension of MNIST to handwritten letters", 2017). ``letters`` labels are 1..26 as stored (0
#: unused), hence 27.
EMNIST_SPLITS: dict[str, int] = {
    "byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10,
}


def _idx_expected() -> tuple[str, ...]:
    return tuple(f"{s}-{k}-idx{d}-ubyte[.gz]" for s in ("train", "t10k") for k, d in (("images", 3), ("labels", 1)))


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo(
        "mnist", "MNIST handwritten digits (LeCun et al. 1998): 60,000 + 10,000 images 28×28, 10 classes",
        "IDX", "http://yann.lecun.com/exdb/mnist/", _idx_expected(), _MNIST),
    "fashion_mnist": DatasetInfo(
        "fashion_mnist", "Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 60,000 + 10,000 images 28×28, 10 classes",
        "IDX", "https://github.com/zalandoresearch/fashion-mnist", _idx_expected(), _FASHION,
        note="same file names as MNIST: the digests tell them apart"),
    "emnist": DatasetInfo(
        "emnist", "EMNIST (Cohen et al. 2017): NIST SD 19 characters as 28×28 images, six splits "
                  "(read as emnist_<split>: " + ", ".join(EMNIST_SPLITS) + ")",
        "IDX", "https://www.nist.gov/itl/products-and-services/emnist-dataset",
        ("gzip.zip (all splits), or its members gzip/" + "emnist-<split>-{train,test}-{images-idx3,labels-idx1}"
         "-ubyte[.gz]",), _EMNIST,
        note="images stored transposed: the reader transposes them back"),
    "cifar10": DatasetInfo(
        "cifar10", "CIFAR-10 (Krizhevsky 2009): 50,000 + 10,000 colour images 32×32, 10 classes",
        "CIFAR binary", "https://www.cs.toronto.edu/~kriz/cifar.html",
        ("cifar-10-binary.tar.gz, or cifar-10-batches-bin/data_batch_{1..5}.bin + test_batch.bin",), _CIFAR10,
        note="the Python (pickle) distribution is refused"),
    "cifar100": DatasetInfo(
        "cifar100", "CIFAR-100 (Krizhevsky 2009): 50,000 + 10,000 colour images 32×32, 100 fine classes",
        "CIFAR binary", "https://www.cs.toronto.edu/~kriz/cifar.html",
        ("cifar-100-binary.tar.gz, or cifar-100-binary/train.bin + test.bin",), _CIFAR100,
        note="the Python (pickle) distribution is refused"),
    "leaf_femnist": DatasetInfo(
        "leaf_femnist", "LEAF FEMNIST (Caldas et al. 2018): EMNIST by writer, 62 classes, natural partition",
        "LEAF JSON", "https://github.com/TalwalkarLab/leaf",
        ("train/*.json, test/*.json (LEAF's data/femnist/data)",),
        note="generated by LEAF's preprocess.sh on your machine: nothing to download, no published digest"),
    "leaf_shakespeare": DatasetInfo(
        "leaf_shakespeare", "LEAF Shakespeare (Caldas et al. 2018): next character after 80, by speaking role",
        "LEAF JSON", "https://github.com/TalwalkarLab/leaf",
        ("train/*.json, test/*.json (LEAF's data/shakespeare/data)",),
        note="generated by LEAF's preprocess.sh on your machine: nothing to download, no published digest"),
    "hf_saved": DatasetInfo(
        "hf_saved", "a Hugging Face `datasets` folder written by save_to_disk (needs pyarrow)",
        "Arrow", "https://huggingface.co/docs/datasets",
        ("dataset_info.json, state.json, data-*.arrow; or dataset_dict.json and one such folder per split",),
        note="your own export: no published digest"),
    "text": DatasetInfo(
        "text", "a folder of UTF-8 .txt files, one document each, for language modelling",
        "text", "", ("*.txt (recursively)",), note="your own corpus: no published digest"),
}


def dataset_info(name: str) -> DatasetInfo | None:
    """The entry of ``name`` (``emnist_<split>`` → the ``emnist`` entry), or None."""
    if name.startswith("emnist_") and name[len("emnist_"):] in EMNIST_SPLITS:
        name = "emnist"
    return DATASETS.get(name)


def published_for(name: str) -> dict[str, Published]:
    """The published files of dataset ``name`` by file name (empty when none are published)."""
    info = dataset_info(name)
    return {} if info is None else {p.name: p for p in info.files}
