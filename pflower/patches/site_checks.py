"""``clientapp-site-checks``: a site's checks run inside Flower's ClientApp runner.

A site's SuperExec (deploy/warm_superexec.py) checks every run's app and records
every reply (deploy/site_guard.py) in site-installed code, before the run's FAB is
unpacked or imported, so a submitted app cannot skip them. Flower's ClientApp
runner (``flwr.supernode.runtime.run_clientapp``) calls three module functions by
name in every task: ``pull_task_input`` (the message, context, run and FAB from the
SuperNode), ``install_from_fab`` (the FAB unpacked; ``fab-reuse`` may have wrapped
it already, and stays under the check) and ``push_message`` (the reply to the
SuperNode). Each is wrapped here around the site's hooks; Flower's own runs as
before. The three functions, their names and signatures are the same in flwr
1.39.0 and 1.42.0.

A site's security, not a speed-up: ``PFLOWER_FLOWER_PATCHES=0`` leaves it on (a site
with the speed patches off still refuses an app it did not approve), and on a Flower
it was not checked against a site does not start (``UntestedVersion``). The check
itself is switched off where the site says so: ``--approved-apps any``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pflower.patches import core


def clientapp_site_checks(
    pulled: Callable[[Any, Any], None],
    installing: Callable[[bytes], None],
    replying: Callable[[Any], Any],
) -> None:
    """``clientapp-site-checks`` in this process and every child forked from it:
    ``pulled(message, context)`` after Flower pulls a task's input; ``installing(fab)``
    before Flower unpacks the FAB's bytes (it raises to refuse the app: nothing is
    unpacked); ``replying(reply)`` before the reply is pushed, which pushes what it
    returns in its place."""
    if not core.applies("clientapp-site-checks"):
        checked = ", ".join(v + "x" for v in core.PATCHES["clientapp-site-checks"][1])
        raise core.UntestedVersion(
            f"flwr {core.installed('flwr')}: the site's checks on every ClientApp (patch "
            f"clientapp-site-checks) were checked against flwr {checked} only: the site "
            "does not start"
        )
    from flwr.supernode.runtime import run_clientapp as runner

    pull, unpack, push = runner.pull_task_input, runner.install_from_fab, runner.push_message

    def pull_task_input(client: Any) -> Any:
        message, context, run, fab = pull(client)
        pulled(message, context)
        return message, context, run, fab

    def install_from_fab(content: bytes, *args: Any, **kwargs: Any) -> Any:
        installing(content)  # before a byte of the app is unpacked
        return unpack(content, *args, **kwargs)

    def push_message(client: Any, message: Any, context: Any) -> None:
        push(client, replying(message), context)

    runner.pull_task_input = pull_task_input
    runner.install_from_fab = install_from_fab
    runner.push_message = push_message
