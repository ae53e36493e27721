"""The dataset layer: real torchvision loaders on tiny files in torchvision's layouts, embedded
datasets, seeded splits, class imbalance, augmentation and the per-process cache."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fake_datasets import write_cifar, write_idx, write_svhn
from trainers.data import (
    AugmentPlan,
    DataConfig,
    DatasetUnavailable,
    augment,
    imbalanced_subset,
    load_count,
    load_images,
    prepare_splits,
    stacked_images,
)
from trainers.data.augment import random_crop, simclr_augment
from trainers.data.sources import downloads_allowed
from trainers.random_sources import random_sources

# the module (trainers.data's `augment` is its function)
augment_module = importlib.import_module("trainers.data.augment")

WRITERS = {
    "cifar10": lambda root: write_cifar(root),
    "cifar100": lambda root: write_cifar(root, classes=100),
    "svhn": write_svhn,
    "fashion_mnist": lambda root: write_idx(root, "FashionMNIST"),
    "mnist": lambda root: write_idx(root, "MNIST"),
}
EXPECTED_FILE = {
    "cifar10": "cifar-10-batches-py/data_batch_1",
    "cifar100": "cifar-100-python/train",
    "svhn": "train_32x32.mat",
    "fashion_mnist": "FashionMNIST/raw/train-images-idx3-ubyte",
    "mnist": "MNIST/raw/train-images-idx3-ubyte",
}


class Config(DataConfig):
    pass


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_torchvision_layouts_load_exactly_what_was_written(name: str, tmp_path: Path) -> None:
    written = WRITERS[name](tmp_path)
    native = 28 if "mnist" in name else 32
    data = load_images(name, root=str(tmp_path), rgb=False, image_size=native)
    for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
        assert np.array_equal(x.numpy(), written[split][0]), f"{name} {split} pixels differ"
        assert np.array_equal(y.numpy(), written[split][1]), f"{name} {split} labels differ"
    assert data.num_classes == (100 if name == "cifar100" else 10)


def test_fashion_mnist_is_padded_to_32_and_repeated_to_rgb(tmp_path: Path) -> None:
    written = write_idx(tmp_path, "FashionMNIST")
    data = load_images("fashion_mnist", root=str(tmp_path), image_size=32)
    assert data.image_shape == (3, 32, 32)
    x = data.train_x.numpy()
    assert np.array_equal(x[:, 0, 2:30, 2:30], written["train"][0][:, 0])
    assert np.array_equal(x[:, 0], x[:, 2])
    assert x[:, :, :2].max() == 0 and x[:, :, 30:].max() == 0


def test_data_root_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_svhn(tmp_path / "from-env")
    monkeypatch.setenv("SEEDGRID_DATA_ROOT", str(tmp_path / "from-env"))
    assert load_images("svhn").image_shape == (3, 32, 32)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_missing_dataset_names_dataset_path_and_remedy(name: str, tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailable) as info:
        load_images(name, root=str(tmp_path / "empty"))
    message = str(info.value)
    assert repr(name) in message
    assert str(tmp_path / "empty" / EXPECTED_FILE[name]) in message
    assert "SEEDGRID_DATA_ROOT" in message and "download: true" in message


def test_corrupt_files_are_reported_before_training(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetUnavailable, match="corrupt or not in torchvision's layout"):
        load_images("cifar10", root=str(tmp_path))
    write_idx(tmp_path, "MNIST")
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00")
    with pytest.raises(DatasetUnavailable, match="'mnist'"):
        load_images("mnist", root=str(tmp_path))


def test_wrong_labels_are_refused(tmp_path: Path) -> None:
    import scipy.io

    write_svhn(tmp_path)
    mat = scipy.io.loadmat(tmp_path / "test_32x32.mat")
    mat["y"][0, 0] = 42
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": mat["X"], "y": mat["y"]})
    with pytest.raises(DatasetUnavailable, match="test split has labels outside 0..9"):
        load_images("svhn", root=str(tmp_path))


def test_a_dataset_is_decoded_once_per_process() -> None:
    first = load_images("synthetic", synthetic=(3, 5, 2, 0.3, 123))
    before = load_count()
    again = load_images("synthetic", synthetic=(3, 5, 2, 0.3, 123))
    assert again is first and load_count() == before
    other = load_images("synthetic", synthetic=(3, 5, 2, 0.3, 124))
    assert other is not first and load_count() == before + 1


def test_digits_are_the_bundled_8x8_images_resized() -> None:
    from sklearn.datasets import load_digits

    data = load_images("digits", image_size=8, rgb=False)
    assert len(data.train_y) + len(data.test_y) == 1797
    assert data.train_x.max() == 255 and data.image_shape == (1, 8, 8)
    bundled = {
        tuple(np.round(img * 255 / 16).astype(np.uint8).ravel()) for img in load_digits().images
    }
    assert all(tuple(img.ravel()) in bundled for img in data.test_x[:20].numpy())
    big = load_images("digits", image_size=16)
    assert big.image_shape == (3, 16, 16) and len(big.test_y) == len(data.test_y)


def test_synthetic_difficulty_makes_classes_harder_to_tell_apart() -> None:
    def nearest_mean_accuracy(difficulty: float) -> float:
        data = load_images("synthetic", synthetic=(5, 60, 40, difficulty, 0))
        x = data.train_x.double().flatten(1)
        means = torch.stack([x[data.train_y == c].mean(0) for c in range(5)])
        test = data.test_x.double().flatten(1)
        return float((torch.cdist(test, means).argmin(1) == data.test_y).double().mean())

    easy, hard = nearest_mean_accuracy(0.0), nearest_mean_accuracy(1.0)
    assert easy > 0.95 and hard < easy - 0.2, (easy, hard)
    a = load_images("synthetic", synthetic=(5, 4, 2, 0.5, 7))
    b = load_images("synthetic", synthetic=(5, 4, 2, 0.5, 8))
    assert not torch.equal(a.train_x, b.train_x)


def test_splits_are_seeded_disjoint_and_the_test_set_is_shared() -> None:
    config = Config(dataset="digits", val_fraction=0.2, test_size=100)
    a = prepare_splits(config, random_sources(1))
    a_again = prepare_splits(config, random_sources(1))
    b = prepare_splits(config, random_sources(2))
    assert torch.equal(a.train, a_again.train) and torch.equal(a.val, a_again.val)
    assert not torch.equal(a.val, b.val)
    assert torch.equal(a.test, b.test) and len(a.test) == 100
    assert not set(a.train.tolist()) & set(a.val.tolist())
    assert len(a.train) + len(a.val) == len(a.data.train_y)
    assert len(a.val) == round(0.2 * len(a.data.train_y))
    # the data source alone decides the split: pinning it pins the split
    c = prepare_splits(config, random_sources(3, overrides={"data": 1}))
    assert torch.equal(a.val, c.val)


def test_imbalance_follows_the_exponential_profile() -> None:
    # the SSL paper's imbalanced CIFAR-10: floor(5000 * 1.5^-i)
    labels = np.repeat(np.arange(10), 5000)
    kept = imbalanced_subset(labels, 10, 1.5**9)
    counts = np.bincount(labels[kept], minlength=10).tolist()
    assert counts == [5000, 3333, 2222, 1481, 987, 658, 438, 292, 195, 130]
    config = Config(dataset="digits", imbalance_ratio=10.0, val_fraction=0.0)
    splits = prepare_splits(config, random_sources(0))
    pool = np.bincount(splits.data.train_y.numpy(), minlength=10)
    expected = [math.floor(pool[c] * 10.0 ** (-c / 9) + 1e-9) for c in range(10)]
    assert np.bincount(splits.labels("train").numpy(), minlength=10).tolist() == expected
    assert len(splits.test) == len(splits.data.test_y)  # test stays balanced and whole


def test_train_size_subsamples_with_the_data_generator() -> None:
    config = Config(dataset="digits", train_size=200)
    a = prepare_splits(config, random_sources(0))
    b = prepare_splits(config, random_sources(1))
    assert len(a.train) == 200 and not torch.equal(a.train, b.train)


def test_strength_maps_to_the_documented_plan() -> None:
    def plan(s: float) -> AugmentPlan:
        return AugmentPlan.from_strength(s, image_side=32, padding_fraction=12 / 32, hflip=True)

    assert plan(0.0) == AugmentPlan(0, False, 0, 0.0)
    assert plan(0.25) == AugmentPlan(6, True, 0, 0.0)
    assert plan(0.5) == AugmentPlan(12, True, 0, 0.0)  # CFF: RandomCrop(32, 12) + HFlip
    assert plan(1.0) == AugmentPlan(18, True, 3, 14.0)  # RandAugment(3, 14), 1.5x padding
    assert plan(0.75).num_ops == 2
    with pytest.raises(ValueError, match="strength"):
        plan(1.5)


def test_random_crop_is_a_shifted_window_of_the_zero_padded_image() -> None:
    x = torch.rand(16, 3, 8, 8)
    out = random_crop(x, 2, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for image, result in zip(padded, out, strict=True):
        windows = [image[:, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(result, w) for w in windows)


def test_augmentation_is_seeded_and_strength_zero_is_the_identity() -> None:
    x = torch.rand(32, 3, 16, 16)
    strong = AugmentPlan.from_strength(1.0, image_side=16, padding_fraction=0.125, hflip=True)
    one = augment(x, strong, torch.Generator().manual_seed(5))
    two = augment(x, strong, torch.Generator().manual_seed(5))
    other = augment(x, strong, torch.Generator().manual_seed(6))
    assert torch.equal(one, two) and not torch.equal(one, other)
    assert one.min() >= 0 and one.max() <= 1
    none = AugmentPlan.from_strength(0.0, image_side=16, padding_fraction=0.125, hflip=True)
    assert torch.equal(augment(x, none, torch.Generator().manual_seed(5)), x)


def test_stronger_augmentation_moves_images_further() -> None:
    x = load_images("synthetic", synthetic=(4, 16, 1, 0.2, 0)).train_x.float() / 255

    def distance(strength: float) -> float:
        plan = AugmentPlan.from_strength(
            strength, image_side=16, padding_fraction=0.125, hflip=False
        )
        out = augment(x, plan, torch.Generator().manual_seed(0))
        return float((out - x).pow(2).mean())

    d = [distance(s) for s in (0.0, 0.25, 0.5, 1.0)]
    assert d[0] == 0.0 and d[1] < d[3] and d[2] < d[3], d


def test_batches_are_normalised_and_cover_the_epoch() -> None:
    config = Config(dataset="digits", image_size=16, augment_strength=0.0)
    splits = prepare_splits(config, random_sources(0))
    seen = torch.cat(list(splits.train_batches(100, torch.Generator().manual_seed(0))))
    assert sorted(seen.tolist()) == list(range(len(splits.train)))
    x, y = splits.images("train")
    assert torch.allclose(
        x.mean(dim=(0, 2, 3)).double(), torch.zeros(3, dtype=torch.float64), atol=0.05
    )
    assert len(y) == len(splits.train)


# ---------------------------------------------------------------------------------------------
# roots the operator controls: a config names a root, never a path


@pytest.mark.parametrize(
    "value", ["/etc", "../data", "data/cifar", "~", "a b", "", "x" * 65, "C:\\data", "fake\x00"]
)
def test_a_config_cannot_name_a_path_as_its_data_root(value: str) -> None:
    with pytest.raises(ValueError, match="not a path"):
        Config(data_root=value)


def test_a_named_root_is_resolved_from_the_operators_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = write_svhn(tmp_path / "svhn-here")
    monkeypatch.setenv("SEEDGRID_DATA_ROOTS", f"house={tmp_path / 'svhn-here'}, other=/nowhere")
    splits = prepare_splits(
        Config(dataset="svhn", data_root="house", rgb=False, image_size=32), random_sources(0)
    )
    assert len(splits.data.train_y) == len(written["train"][1])
    with pytest.raises(DatasetUnavailable) as info:
        prepare_splits(Config(dataset="svhn", data_root="elsewhere"), random_sources(0))
    message = str(info.value)
    assert "'elsewhere' is not configured on this worker" in message
    assert "house, other" in message and "SEEDGRID_DATA_ROOTS" in message


@pytest.mark.parametrize(
    "text", ["just-a-name", "name=relative/path", "../x=/abs", "a=/x,a=/y", "bad name=/x"]
)
def test_malformed_data_roots_are_refused_naming_the_entry(text: str) -> None:
    from api_schemas.data_roots import parse_data_roots

    with pytest.raises(ValueError, match="SEEDGRID_DATA_ROOTS"):
        parse_data_roots(text)


@pytest.mark.parametrize(
    "value", ["on", "ON", "yes", "Y", "1", "true", "t", "off", "no", "0", "false", "F", "n"]
)
def test_the_workers_read_allow_download_as_the_service_does(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SEEDGRID_ALLOW_DOWNLOAD=on was "yes" to the service's settings and "no" to the workers:
    a spec asking to download was accepted and every one of its runs failed."""
    from service.settings import Settings

    monkeypatch.setenv("SEEDGRID_ALLOW_DOWNLOAD", value)
    assert downloads_allowed() is Settings().allow_download


def test_a_value_allow_download_cannot_mean_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEEDGRID_ALLOW_DOWNLOAD", "maybe")
    with pytest.raises(DatasetUnavailable, match="SEEDGRID_ALLOW_DOWNLOAD.*'maybe'"):
        downloads_allowed()


def test_download_needs_the_operators_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDGRID_DATA_ROOT", str(tmp_path))
    monkeypatch.delenv("SEEDGRID_ALLOW_DOWNLOAD", raising=False)
    with pytest.raises(DatasetUnavailable, match="downloads are off on this worker") as info:
        prepare_splits(Config(dataset="cifar10", download=True), random_sources(0))
    assert "SEEDGRID_ALLOW_DOWNLOAD" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing was fetched or written


def test_the_dataset_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainers.data import sources

    one = load_images("synthetic", synthetic=(4, 50, 10, 0.5, 900))
    size_gb = sources.dataset_bytes(one) / 2**30
    # room for two of these, not three: the least recently used goes
    monkeypatch.setenv("SEEDGRID_DATASET_CACHE_GB", str(2.5 * size_gb))
    first = load_images("synthetic", synthetic=(4, 50, 10, 0.5, 901))
    second = load_images("synthetic", synthetic=(4, 50, 10, 0.5, 902))
    assert load_images("synthetic", synthetic=(4, 50, 10, 0.5, 901)) is first  # refreshed
    before = load_count()
    load_images("synthetic", synthetic=(4, 50, 10, 0.5, 903))
    assert sources.cached_datasets() == 2
    assert load_images("synthetic", synthetic=(4, 50, 10, 0.5, 901)) is first
    assert load_images("synthetic", synthetic=(4, 50, 10, 0.5, 902)) is not second  # evicted
    assert load_count() == before + 2
    monkeypatch.setenv("SEEDGRID_DATASET_CACHE_GB", "1000")
    for seed in range(904, 904 + sources.MAX_CACHED_DATASETS + 3):
        load_images("synthetic", synthetic=(2, 2, 1, 0.5, seed))
    assert sources.cached_datasets() == sources.MAX_CACHED_DATASETS
    monkeypatch.setenv("SEEDGRID_DATASET_CACHE_GB", "lots")
    with pytest.raises(DatasetUnavailable, match="SEEDGRID_DATASET_CACHE_GB='lots'"):
        load_images("synthetic", synthetic=(2, 2, 1, 0.5, 999))


# ---------------------------------------------------------------------------------------------
# the pre-flight: what would fail every run, found by looking before anything is queued


@pytest.mark.parametrize("trainer_name", ["cff", "ssl", "feedback"])
def test_each_trainers_preflight_names_what_its_runs_would_fail_on(
    trainer_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainers import REGISTRY

    trainer = REGISTRY[trainer_name]
    monkeypatch.setenv("SEEDGRID_DATA_ROOT", str(tmp_path / "default"))
    monkeypatch.setenv("SEEDGRID_DATA_ROOTS", f"here={tmp_path / 'here'}")
    monkeypatch.delenv("SEEDGRID_ALLOW_DOWNLOAD", raising=False)
    write_cifar(tmp_path / "here")

    def problems(**config: object) -> list[tuple[str, str]]:
        return [(p.field, p.message) for p in trainer.preflight(trainer.Config(**config))]

    assert problems(dataset="digits") == [] and problems(dataset="cifar10", data_root="here") == []
    ((field, message),) = problems(dataset="cifar10")
    # the loader's own message: the dataset, the missing file under the default root (named,
    # the file relative to it: the operator's paths are not the client's to see), the remedy
    assert field == "dataset" and message.startswith(
        "dataset 'cifar10' not found under the default data root (missing "
        f"{EXPECTED_FILE['cifar10']},"
    )
    assert str(tmp_path) not in message and "SEEDGRID_DATA_ROOT" in message
    (tmp_path / "here" / EXPECTED_FILE["cifar10"]).unlink()
    ((field, message),) = problems(dataset="cifar10", data_root="here")
    assert message.startswith(
        f"dataset 'cifar10' not found under data root 'here' (missing {EXPECTED_FILE['cifar10']})"
    )
    assert str(tmp_path) not in message
    ((field, message),) = problems(dataset="svhn", data_root="elsewhere")
    assert field == "data_root" and "'elsewhere' is not configured on this worker" in message
    ((field, message),) = problems(dataset="cifar10", download=True)
    assert field == "download" and "SEEDGRID_ALLOW_DOWNLOAD" in message
    # `cuda` on this CPU machine; `auto` falls back to the CPU and is never refused
    assert [f for f, _ in problems(dataset="digits", device="cuda")] == ["device"]
    assert problems(dataset="digits", device="auto") == []
    # configs are checked once per distinct inputs; digits on auto needs no check at all
    assert trainer.preflight_inputs(trainer.Config(dataset="digits")) == {}
    assert (
        trainer.preflight_inputs(trainer.Config(dataset="cifar10", augment_strength=0.0))
        == trainer.preflight_inputs(trainer.Config(dataset="cifar10"))
        == {"dataset": "cifar10", "data_root": None, "download": False}
    )


def test_the_preflight_looks_at_files_and_never_opens_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CIFAR's files are pickles: the pre-flight checks that each exists, the run decodes it."""
    from trainers import REGISTRY

    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    monkeypatch.setenv("SEEDGRID_DATA_ROOT", str(tmp_path))
    assert REGISTRY["cff"].preflight(REGISTRY["cff"].Config(dataset="cifar10")) == []


def test_studentnet_and_trainers_without_data_have_nothing_to_check() -> None:
    from trainers import REGISTRY

    feedback = REGISTRY["feedback"]
    studentnet = feedback.Config(arch="studentnet", dataset="cifar10")
    assert feedback.preflight_inputs(studentnet) == {} and feedback.preflight(studentnet) == []
    for name in ("collapse", "ssl_sim"):
        trainer = REGISTRY[name]
        assert trainer.preflight_inputs(trainer.Config()) == {}
        assert trainer.preflight(trainer.Config()) == []


def test_augmentation_constants_are_made_once_per_device_and_give_the_same_bits() -> None:
    """normalize's mean and std (and the colour matrices) are cached device constants, not a
    tensor built from Python numbers on every batch (a blocking host-to-device copy on a GPU):
    the same object on each call, usable by autograd even when first made in inference mode,
    and the same bits as the per-call tensors they replace."""
    import importlib

    augment_module = importlib.import_module("trainers.data.augment")
    augment_module.device_constant.cache_clear()
    mean, std = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
    with torch.inference_mode():
        first = augment_module.device_constant(mean, torch.float32, torch.device("cpu"))
    assert not first.is_inference()
    assert augment_module.device_constant(mean, torch.float32, torch.device("cpu")) is first
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    expected = (x - torch.tensor(mean)[None, :, None, None]) / torch.tensor(std)[
        None, :, None, None
    ]
    got = augment_module.normalize(x, mean, std)
    assert torch.equal(got, expected)
    got.sum().backward()  # autograd saves the cached std
    assert x.grad is not None


@pytest.mark.parametrize("strength", [0.5, 1.0])
def test_stacked_images_are_each_seeds_own_views_from_the_same_draws(strength: float) -> None:
    """A seed-batched task gathers, augments and normalises all its seeds' batches at once:
    each seed's slice equals its own `images` calls (one per view, from its generator, in
    that order) bit for bit, RandAugment included."""
    config = Config(dataset="digits", augment_strength=strength)
    seeds = [prepare_splits(config, random_sources(s)) for s in (0, 1, 2)]
    positions = [torch.tensor([3, 1, 4, 1, 5, 9]), torch.arange(6), torch.tensor([2] * 6)]

    def generators() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(10 + s) for s in range(3)]

    x, y = stacked_images(seeds, "train", positions, generators(), views=2)
    assert x.shape[:2] == (3, 12) and y.shape == (3, 6)
    for k, (splits, p, g) in enumerate(zip(seeds, positions, generators(), strict=True)):
        one, labels = splits.images("train", p, augment_generator=g)
        two, _ = splits.images("train", p, augment_generator=g)
        assert torch.equal(x[k], torch.cat([one, two])), k
        assert torch.equal(y[k], labels), k
    plain, _ = stacked_images(seeds, "val", [torch.arange(4)] * 3)  # no generators: as drawn
    assert torch.equal(plain[1], seeds[1].images("val", torch.arange(4))[0])
    with pytest.raises(ValueError, match="differ in size"):
        stacked_images(seeds[:2], "train", [torch.arange(3), torch.arange(4)])


@pytest.mark.parametrize(("channels", "hflip"), [(3, True), (1, False)])
def test_a_simclr_view_draws_from_its_generator_and_moves_its_draws_in_one_copy(
    channels: int, hflip: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same generator state gives the same view; every uniform draw of a view is made on
    the host and moved to the images' device at once (one copy a view, not one per draw: on
    a GPU each was a host-to-device copy); the view stays an image on [0, 1]."""
    x = torch.rand(8, channels, 12, 12, generator=torch.Generator().manual_seed(0))
    moved: list[tuple[int, ...]] = []
    real = augment_module._to

    def counted(draws: torch.Tensor, device: torch.device) -> torch.Tensor:
        moved.append(tuple(draws.shape))
        return real(draws, device)

    monkeypatch.setattr(augment_module, "_to", counted)
    one = simclr_augment(x, torch.Generator().manual_seed(3), hflip=hflip)
    assert len(moved) == 1 and moved[0][1] == len(x), moved
    again = simclr_augment(x, torch.Generator().manual_seed(3), hflip=hflip)
    other = simclr_augment(x, torch.Generator().manual_seed(4), hflip=hflip)
    assert torch.equal(one, again) and not torch.equal(one, other)
    assert one.shape == x.shape and 0.0 <= float(one.min()) and float(one.max()) <= 1.0
