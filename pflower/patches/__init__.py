"""Every Flower or torch internal the product patches or reads, in one module.

Each patch replaces a private function or default of one library version, or uses
one of its private attributes: for a speed measured (docs/PERFORMANCE.md; each
measurement in docs/notes/), none changing what is computed or sent; or, where the
last paragraph says so, for a fix or a site's own checks. No module outside this
package rebinds a Flower or torch name or reads their private attributes
(tests/test_patch_table.py).

| patch | what it replaces | why | checked against |
|---|---|---|---|
| ``linkstate-index`` | flwr ``InMemoryLinkState.store_message_ins`` / ``get_message_ins``, ``vce_api.add_messages_to_queue`` | the simulation engine scanned every stored message for every node ten times a second (N^2 per round) | flwr 1.39.0, 1.42.0 |
| ``supernode-backoff`` | flwr ``start_client_internal``'s ``time`` and ``_pull_and_store_message`` | a SuperNode slept 3 s between empty pulls | flwr 1.39.0, 1.42.0 |
| ``fleet-long-poll`` | flwr ``pull_messages`` of the SuperLink's Fleet (1.39: ``message_handler``; 1.42: ``fleet_handlers``, both servicers; pflower/flower_lines.py), ``InMemoryLinkState`` / ``SqlLinkState.store_message_ins`` | a site learnt of its next message at its next poll, 0.4-0.7 s a message in a deployed round | flwr 1.39.0, 1.42.0 |
| ``object-retries`` | the ``initial_backoff``, ``backoff_cap`` and ``max_tries_per_object`` defaults of flwr's ``pull_objects`` / ``pull_and_inflate_object_from_tree`` | a message part not there yet was asked for again after 1 s, then up to 10 s apart | flwr 1.39.0, 1.42.0 |
| ``fab-reuse`` | flwr ``run_clientapp.install_from_fab`` | a ClientApp unpacked and hashed the whole FAB on every message, then used the copy installed before | flwr 1.39.0, 1.42.0 |
| ``superexec-fork`` | flwr ``run_superexec.get_executor`` | a ClientApp started a fresh Python per message | flwr 1.39.0, 1.42.0 (the same ``Executor`` interface; tests/test_deployment.py's warm sites) |
| ``clientapp-task-end`` | flwr ``run_clientapp.flwr_exit``, in a warm SuperExec's worker | a ClientApp process exited after each message: the app imported, its config read and its model built again for the next | flwr 1.39.0, 1.42.0 |
| ``optimizers-without-dynamo`` | the ``torch._dynamo`` wrappers of ``torch.optim.SGD`` / ``Adam`` | torch imported ``torch._dynamo`` on an optimizer's first use: 2-5 s per process | torch 2.13, 2.14 |
| ``secagg-masks`` | flwr ``pseudo_rand_gen`` where SecAgg+ masks (client mod, server workflow) | it folds every seed to 32 bits and expands it with a Mersenne Twister (flwr issue #7522) | flwr 1.39.0, 1.42.0 |
| ``npy-headers`` | flwr ``compat.common.parameter.bytes_to_ndarray`` | ``np.load`` parsed every tensor's header with ``ast.literal_eval``: 1.5 ms a CNN's parameters, on the server each reply and on the client each message | flwr 1.39.0, 1.42.0 |
| ``engine-wakeups`` | flwr ``InMemoryLinkState.store_message_ins`` / ``store_message_res`` (and ``linkstate-index``'s loop, our ``PollingGrid``'s wait) | in simulation a round's instructions reached the actors up to 0.1 s after the ServerApp stored them, and its last reply reached the ServerApp a median 11-14 ms after the engine stored it | flwr 1.39.0, 1.42.0 |
| ``ray-app-once`` | flwr ``BasicActorPool.submit`` (put in place by ``vce_api.run_api``, as the next) | the Ray simulation cloudpickled the whole ClientApp into every message's actor call | flwr 1.39.0, 1.42.0 |
| ``ray-two-in-flight`` | flwr ``BasicActorPool.add_actors_to_pool`` / ``terminate_all_actors``, ``RayBackend.num_workers`` | a Ray actor was handed its next message only once its last reply was back (a median 11 ms idle between messages) | flwr 1.39.0, 1.42.0 |
| ``ray-weights-once`` | flwr ``BasicActorPool.submit`` (as the last), Ray's pickling of flwr ``Array`` in the simulation process (``ray.util.register_serializer``) | the Ray simulation pickled the round's weights into every message's actor call, and each actor unpickled its own copy | flwr 1.39.0, 1.42.0 |
| ``sparse-node-stores`` | flwr ``vce_api._register_node_info_stores`` and ``run_api``, ``DeprecatedRunInfoStore.register_context`` | the simulation engine made a Context for every node before the first round, with the run config parsed again for each under ``flwr run``: 18.7 KB and 2.3 ms a node | flwr 1.39.0, 1.42.0 |
| ``activation-retry`` | the Fleet client's ``ActivateNode`` (1.39: the gRPC stub, through ``grpc_rere_client.connection.wrap_stub``; 1.42: ``FleetHttpClient.ActivateNode``), in ``deploy.fast_supernode`` | a SuperNode restarted within a minute of a crash exited 305 (the SuperLink refuses its key until the old session's heartbeat lapses); now it asks again, 1-10 s apart, for up to 150 s | flwr 1.39.0, 1.42.0 (the 1.42 client read in its wheel) |
| ``serverapp-after-ray`` | nothing: the ServerApp waits on the thread flwr ``run_serverapp_th`` starts (its target by name) | Flower's simulation starts the ServerApp's thread before Ray, whose services are forked with a Python ``preexec_fn`` beside it: once a forked ``gcs_server`` blocked before its exec and the run hung | flwr 1.39.0, 1.42.0 |
| ``clientapp-site-checks`` | flwr ``run_clientapp.pull_task_input`` / ``install_from_fab`` (over ``fab-reuse``'s) / ``push_message``, in a site's SuperExec | a site checks a run's app before Flower unpacks it and lists each reply in its ledger before Flower sends it, in site-installed code a submitted app cannot skip (deploy/site_guard.py) | flwr 1.39.0, 1.42.0 |
| ``reply-downloads-apart`` | nothing: the private ``_runtime_client`` of flwr's ``HttpGrid``, and its ``_client`` on a copy, in our ``PollingGrid`` | Flower's ``pull_messages`` downloaded the found replies' parts one reply after another, retrying a missing part for minutes: one site that died mid-upload held back every other reply of the round | flwr 1.39.0, 1.42.0 |
| ``resident-model-hooks`` | nothing: torch ``nn.Module``'s private ``_forward_hooks`` / ``_forward_pre_hooks`` / ``_backward_hooks`` and a parameter's ``_backward_hooks``, read | a client thread's model is kept across rounds only if no hook is left on it, and torch has no public way to ask | torch 2.13, 2.14 |

Each patch is its own module, in the table's order: ``linkstate``, ``backoff``,
``long_poll``, ``retries``, ``fab``, ``fork``, ``task_end``, ``optim``, ``secagg``, ``npy``,
``wakeups``, ``ray_app``, ``ray_pipeline``, ``ray_weights``, ``node_stores``, ``activation``,
``start_order``, ``site_checks``, ``reply_downloads``, ``module_hooks``;
``core`` holds the switch and the version check, ``timing`` the waits the polling
patches share. Callers import them from here.

``PFLOWER_FLOWER_PATCHES=0`` turns every speed patch off: Flower and torch run as
they are (slower, nothing else changes). ``secagg-masks`` is a security fix, not a
speed-up, and stays on: its protocol version travels in the SecAgg+ set-up, and
a peer that speaks another refuses the round in one line. ``serverapp-after-ray``, a fix
for a hang, ``activation-retry``, a fix for a site that could not come back after a
crash, and ``clientapp-site-checks``, a site's own checks (its off switch is the site's
``--approved-apps any``), stay on too. With patches on, ``check()`` refuses a Flower
or torch version the table does not list, in one line that names the switch.
"""

from __future__ import annotations

# one module a patch; everything callers use, from here
from pflower.patches.activation import activation_retry
from pflower.patches.backoff import IdleBackoff, supernode_backoff
from pflower.patches.core import PATCHES, SWITCH, TESTED, UntestedVersion, check, enabled
from pflower.patches.fab import fab_reuse, installed_fab
from pflower.patches.fork import superexec_fork
from pflower.patches.linkstate import linkstate_index
from pflower.patches.long_poll import fleet_long_poll
from pflower.patches.module_hooks import hooks_left
from pflower.patches.node_stores import sparse_node_stores
from pflower.patches.npy import npy_headers, read_only_arrays
from pflower.patches.optim import optimizers
from pflower.patches.ray_app import ray_app_once
from pflower.patches.ray_engine import when_the_engine_starts as ray_when_the_engine_starts
from pflower.patches.ray_pipeline import IN_FLIGHT, ray_two_in_flight
from pflower.patches.ray_weights import ray_weights_once
from pflower.patches.reply_downloads import deployed as deployed_grid
from pflower.patches.reply_downloads import pull_found, runtime_client
from pflower.patches.retries import object_retries
from pflower.patches.secagg import SECAGG_PROTOCOL, mask_arrays, secagg_masks
from pflower.patches.site_checks import clientapp_site_checks
from pflower.patches.start_order import serverapp_after_ray
from pflower.patches.task_end import TaskEnded, clientapp_task_end
from pflower.patches.timing import LONG_POLL
from pflower.patches.wakeups import engine_wakeups

__all__ = [
    "activation_retry",
    "IN_FLIGHT",
    "LONG_POLL",
    "PATCHES",
    "SECAGG_PROTOCOL",
    "SWITCH",
    "TESTED",
    "IdleBackoff",
    "TaskEnded",
    "UntestedVersion",
    "check",
    "clientapp_site_checks",
    "clientapp_task_end",
    "deployed_grid",
    "enabled",
    "engine_wakeups",
    "fab_reuse",
    "fleet_long_poll",
    "hooks_left",
    "installed_fab",
    "linkstate_index",
    "mask_arrays",
    "npy_headers",
    "object_retries",
    "optimizers",
    "pull_found",
    "ray_app_once",
    "ray_two_in_flight",
    "ray_weights_once",
    "ray_when_the_engine_starts",
    "read_only_arrays",
    "runtime_client",
    "secagg_masks",
    "serverapp_after_ray",
    "sparse_node_stores",
    "superexec_fork",
    "supernode_backoff",
]
