"""What a site's error reply says: an error that leaves a site is a disclosure.

A ClientApp that raises sends Flower's error reply, whose text is the exception's:
a pandas ``KeyError`` lists the site's columns, an ``OSError`` its file paths, a
shape error its data's size. ``errors_mod`` keeps the full text in the site's own
log and sends the site's name, the message's phase and the exception's class only;
an exception of ours written to be sent (``PublicError``) goes as it is. The
site's ledger lists the error reply as sent (deploy/site_guard.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Error, Message
from flwr.common.constant import ErrorCode

from pflower.config.node import NodeConfig, name_of
from pflower.config.refusal import refusal_text
from pflower.config.schema import ConfigError

log = logging.getLogger("flwr.pflower")
_named = threading.local()  # the site name the ClientApp gave this message's client


def name_site(name: str) -> None:
    """This message's client is site ``name`` (a natural partition's, by its value):
    its error reply says so. The ClientApp calls it once it knows the name."""
    _named.site = name


class PublicError(RuntimeError):
    """An error written to be sent as it is: it names the site and no path, column
    or value of its data (a policy refusal, a simulated dropout)."""


class SiteError(RuntimeError):
    """The error reply a site sends in place of what its code raised."""


def site_name(node: Mapping[str, Any] | NodeConfig) -> str:
    """The site's client key: its ``site`` node config, else its partition's (a node
    config that does not parse: its ``site`` as given)."""
    return node.client_key if isinstance(node, NodeConfig) else name_of(node)


def simulated(node: Mapping[str, Any] | NodeConfig) -> bool:
    """Whether this node is a simulated client (Flower's simulation numbers its
    partitions), not a deployed site (which names itself); False for a node config
    that does not parse."""
    try:
        return NodeConfig.of(node).simulated
    except ConfigError:
        return False


def error_reply_text(
    node: Mapping[str, Any] | NodeConfig, message_type: str, err: BaseException
) -> str:
    """The one line a site sends for ``err`` raised while handling ``message_type``."""
    name = type(err).__name__
    return f"site {site_name(node)!r} failed in {message_type}: {name}; the details stay in its log"


def errors_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Raise ``SiteError`` with ``error_reply_text`` for whatever the app raises (the
    full traceback logged here, on the site)."""
    _named.site = None
    try:
        return call_next(msg, context)
    except Exception as err:
        if isinstance(err, (PublicError, SiteError)):
            raise
        node = context.node_config
        if isinstance(err, ConfigError) and simulated(node):
            # the run's config, refused by a simulated client: its line as the reply (the
            # server shares this machine and data), not raised (a traceback per client
            # from Ray and Flower); the server stops the run (pflower/config/refusal.py)
            reason = refusal_text(getattr(_named, "site", None) or site_name(node), err)
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=msg)
        log.exception("%s failed in %s", site_name(node), msg.metadata.message_type)
        raise SiteError(error_reply_text(node, msg.metadata.message_type, err)) from None
