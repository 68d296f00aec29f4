"""The ServerApp side. In Flower's simulation process the engine builds its nodes'
stores while the ServerApp's thread imports this package: ``sparse-node-stores`` goes
in place here, first, before the app's own imports (pflower/patches/node_stores.py)."""

import sys

if "flwr.server.superlink.fleet.vce.vce_api" in sys.modules:  # Flower's simulation engine
    from pflower.patches.node_stores import sparse_node_stores

    sparse_node_stores()
