"""The `ssl` and `ssl_sim` trainers end to end through the HTTP API on a real local Ray."""

from __future__ import annotations

import numpy as np

from tests.conftest import Service


def test_convergence_simulation_steps_grow_with_the_squared_norm(service: Service) -> None:
    norms = [0.25, 0.5, 1.0, 2.0, 4.0]
    created = service.submit(
        {
            "name": "ssl-convergence",
            "trainer": "ssl_sim",
            "config": {"simulation": "convergence"},
            "grid": {"initial_norm": norms},
            "seeds": 3,
        }
    )
    detail = service.wait(created["id"], timeout_s=180)
    assert detail["counts"]["completed"] == 15, detail
    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert stats["metric"] == "steps_to_converge"
    means = {c["condition"]["initial_norm"]: c["mean"] for c in stats["conditions"]}
    assert all(c["n"] == 3 for c in stats["conditions"])
    slope, _ = np.polyfit(np.log(norms), np.log([means[n] for n in norms]), 1)
    assert 1.8 <= slope <= 2.2, (slope, means)
    assert abs(means[1.0] - 96) <= 5  # about 96 rho^2 with the spec's settings


def test_simclr_and_simsiam_cut_grid_stores_norm_curves(service: Service) -> None:
    created = service.submit(
        {
            "name": "ssl-cut",
            "trainer": "ssl",
            "config": {
                "dataset": "digits",
                "image_size": 8,
                "backbone": "resnet_small",
                "proj_dim": 16,
                "pred_hidden": 8,
                "epochs": 2,
                "warmup_epochs": 1,
                "batch_size": 256,
                "knn_k": 20,
                "device": "cpu",
                # 1,024 of digits' training images: four steps an epoch, as many as SimCLR
                # needs to grow its cut norms back (seeds 0-2, mean norm at cut 3 over cut 1:
                # SimCLR 0.86, SimSiam 0.06; 512 images: SimCLR 0.29, it has not yet)
                "train_size": 1024,
            },
            "grid": {"method": ["simclr", "simsiam"], "cut": [1.0, 3.0]},
            "seeds": 3,
        }
    )
    detail = service.wait(created["id"], timeout_s=300)
    assert detail["counts"]["completed"] == 12, detail
    runs = service.runs(created["id"])
    for run in runs:
        curve = service.client.get(
            f"/runs/{run['id']}/metrics", params={"name": "norm_mean"}
        ).json()
        assert [p["epoch"] for p in curve] == [0, 1]
        assert len(run["diagnostics"]["norm_per_class"]) == 10
    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert stats["metric"] == "knn_accuracy" and len(stats["conditions"]) == 4
    norms = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "norm_mean"}
    ).json()
    mean_norm = {
        (c["condition"]["method"], c["condition"]["cut"]): c["mean"] for c in norms["conditions"]
    }
    # SimSiam's cut-initialised embeddings stay far smaller (SimCLR's small norms get large
    # effective steps, 1/||z||^2, and grow back fast: the paper's catch-22)
    assert mean_norm[("simsiam", 3.0)] < 0.5 * mean_norm[("simsiam", 1.0)]
    cut = [c for c in norms["comparisons"] if c["factor"] == "cut"]
    assert {None if c["within"] is None else c["within"]["method"] for c in cut} == {
        None,
        "simclr",
        "simsiam",
    }


def test_latent_class_frequency_effect_holds_across_seeds(service: Service) -> None:
    # Paper 001's latent-class simulation at the notebook's settings (weights 1:2:4:8, spread
    # 1, SGD 0.01, batch 128, 100 epochs). A single seed's per-class norms are noisy (the full
    # frequency order holds in about 1 seed in 10, docs/design-notes.md); across seeds the
    # effect is significant: the 95% t-interval of the seed-mean rank correlation between
    # class frequency and mean norm lies above 0, and that of most-frequent / rarest mean norm
    # above 1 (seeds 0-23: lower bounds 0.25 and 1.046; seeds 24-47: 0.26 and 1.052).
    created = service.submit(
        {
            "name": "ssl-latent-class",
            "trainer": "ssl_sim",
            "config": {"simulation": "latent_class"},
            "seeds": 24,
            "metric": "norm_frequency_spearman",
            # two seed-batched tasks of 12, one per CPU of the test cluster (8 a task by default)
            "resources": {"seeds_per_task": 12},
        }
    )
    detail = service.wait(created["id"], timeout_s=400)
    assert detail["counts"]["completed"] == 24, detail
    run = service.runs(created["id"])[0]
    curve = service.client.get(f"/runs/{run['id']}/metrics", params={"name": "norm_class3"}).json()
    # epoch 0 is the untrained network; one point per training epoch follows
    assert [p["epoch"] for p in curve] == list(range(101)) and curve[0]["step"] == 0
    (rho,) = service.client.get(f"/experiments/{created['id']}/stats").json()["conditions"]
    assert rho["n"] == 24 and rho["ci95"][0] > 0, rho
    ratio_stats = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "norm_most_over_least_frequent"}
    ).json()
    (ratio,) = ratio_stats["conditions"]
    assert ratio["ci95"][0] > 1, ratio
