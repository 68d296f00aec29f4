"""What a deployed site declares of its own data.

A site's node config (``deploy.site --label-column ...``) may name its own table
columns: they replace the run's for this site's data alone, so a hospital whose
label column is called ``target`` joins a run that says ``label-column='num'``.
Asked before round 1 (a properties query with ``data-info``), a site answers the
input shape and class count its data give, so a run config needs no
``input-shape``: the ServerApp builds the model from the sites' answers
(server_app/site_info.py) and refuses sites that disagree, naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pflower.config.node import SITE_DATA_FIELDS, NodeConfig

if TYPE_CHECKING:  # deploy.site reads the keys without importing torch
    from pflower.data import DataInfo

SITE_DATA_KEYS = tuple(NodeConfig.key(n) for n in SITE_DATA_FIELDS)
ASK_DATA_INFO = "data-info"  # the properties query's config key
SHAPE_KEY, CLASSES_COUNT_KEY = "data-input-shape", "data-num-classes"


def site_declared(node: Mapping[str, Any] | NodeConfig) -> dict[str, str]:
    """The data keys this site's node config declares (they override the run's)."""
    return NodeConfig.of(node).site_data


def data_info_properties(info: DataInfo) -> dict[str, str | int]:
    """A site's answer to ``data-info``: its input shape and class count, no values."""
    return {SHAPE_KEY: ",".join(map(str, info.input_shape)), CLASSES_COUNT_KEY: info.num_classes}
