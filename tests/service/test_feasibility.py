"""The dispatcher's check that some node can ever hold a run's resource request."""

from __future__ import annotations

from service.scheduling.ray_helpers import infeasible


def test_a_request_is_feasible_when_one_node_has_both_cpus_and_gpus() -> None:
    nodes = [(1.0, 0.0), (2.0, 1.0), (2.0, 1.0)]
    assert infeasible(0.5, 0.5, nodes) is None
    assert infeasible(2.0, 1.0, nodes) is None
    assert infeasible(1.0, 0.0, nodes) is None


def test_a_request_no_single_node_can_hold_is_explained() -> None:
    nodes = [(8.0, 0.0), (2.0, 1.0)]
    # 8 CPUs exist and a GPU exists, but never on the same node
    message = infeasible(4.0, 1.0, nodes)
    assert message is not None and "num_cpus=4, num_gpus=1" in message
    assert "8 CPUs and 1 GPUs" in message and "SEEDGRID_FAIL_INFEASIBLE_RUNS" in message
    assert infeasible(0.5, 2.0, nodes) is not None


def test_nothing_known_about_the_nodes_refuses_nothing() -> None:
    assert infeasible(64.0, 8.0, []) is None
