"""A site's own backbone (node config ``model`` and ``hidden-dim``): FedProto, whose
sites share class prototypes and no weights, runs a federation of two backbones; a
method whose shared tensors depend on the backbone refuses a site's own in one line
naming the key, before any training."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.presets import CIFAR10_DEV
from pflower.config.node import NodeConfig
from pflower.config.refusal import ClientConfigError
from pflower.engine.inprocess import run_inprocess

IMAGES = {
    "dataset": str(CIFAR10_DEV),
    "model": "cnn4",
    "train-per-client": 40,
    "test-per-client": 20,
    "num-server-rounds": 2,
}
# cnn4's features are 512 wide; an MLP of hidden width 512 on the same images matches it
MLP_SITE = {"model": "mlp", "hidden-dim": 512}


def test_the_node_config_reads_a_sites_backbone() -> None:
    assert NodeConfig.of(MLP_SITE).site_model == {"model": "mlp", "hidden-dim": 512}
    assert NodeConfig.of({"partition-id": 0}).site_model == {}


def test_fedproto_federates_two_backbones(tmp_path: Path) -> None:
    config = {**IMAGES, "method": "fedproto", "output-dir": str(tmp_path), "run-name": "two"}
    res = run_inprocess(config, 3, node_configs=[{}, MLP_SITE, {}])
    assert res["outcome"]["status"] == "completed"
    last = res["rounds"][-1]
    assert sorted(last["per_client_accuracy"]) == ["client-0", "client-1", "client-2"]
    assert last["replies"] == 3  # the MLP site's prototypes folded in with the CNNs'


@pytest.mark.parametrize(
    ("method", "site", "entry"),
    [
        ("fedavg", MLP_SITE, "features.0.bias"),  # weights: other names and shapes
        ("fedproto", {"model": "mlp", "hidden-dim": 64}, "proto_sums"),  # other width
    ],
)
def test_a_backbone_whose_shared_tensors_differ_is_refused(
    method: str, site: dict, entry: str, tmp_path: Path
) -> None:
    config = {**IMAGES, "method": method, "output-dir": str(tmp_path), "run-name": method}
    with pytest.raises(
        ClientConfigError, match=f"node config 'model'.*'{entry}'.*class prototypes"
    ):
        run_inprocess(config, 2, node_configs=[{}, site])
