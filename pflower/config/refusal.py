"""A bad config a simulated client finds ends the run once, in one line.

The pre-flight checks what it can before anything starts; what only a client finds
(its own partition's data) it refuses as a ``ConfigError``. In simulation the
client sends that line as its error reply (``refusal_text``, client_app/errors.py:
the server runs on the same machine and data, so nothing is disclosed), without
raising (a raise is a Ray traceback and Flower's, per client and round). The server
stops the run at the first such reply (``stop_at_refusal``), and the ServerApp's
failure is logged as that one line (``OneLineConfigErrors``), not as a traceback.
A deployed site's errors stay in its own log (client_app/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pflower.config.schema import ConfigError

MARKER = "config error at "  # a simulated client's refusal: the marker, its site, the line
FLOWER_SUFFIX = "). It originated during client-side execution"  # Flower's error wrapper


class ClientConfigError(ConfigError):
    """A simulated client refused the run's config (the run stops at the first)."""


def refusal_text(site: str, err: BaseException) -> str:
    """The error reply of a simulated client that refuses the run's config."""
    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{MARKER}site {site!r}: {line.removeprefix('invalid run config: ')}"


def refusal_in(failure: object) -> str | None:
    """The refusal a failed client's error carries (``site 'x': config key ...``), or
    None; whatever Flower wrapped around it is cut off."""
    text = str(failure)
    at = text.find(MARKER)
    if at < 0:
        return None
    line = text[at + len(MARKER) :]
    return line.split(FLOWER_SUFFIX)[0].split("\n")[0].strip()


def stop_at_refusal(failures: Iterable[object], when: str) -> None:
    """ClientConfigError with the first simulated client's config refusal among
    ``failures`` (``when``: "round 3", "before round 1"), if there is one."""
    for failure in failures:
        line = refusal_in(failure)
        if line is not None:
            raise ClientConfigError(f"{line} ({when}; the run stops at a client's refusal)")


class OneLineConfigErrors(logging.Filter):
    """A logged failure whose cause is a ConfigError becomes its one line: Flower logs
    the ServerApp's exception with its traceback (tens of lines of Flower's frames
    around the line that says which key to change)."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        while err is not None and not isinstance(err, ConfigError):
            err = err.__cause__ or err.__context__
        if err is not None:
            message = str(err).removeprefix("invalid run config: ")
            record.msg, record.args = f"config error: {message}", ()
            record.exc_info, record.exc_text = None, None
        return True


def one_line_config_errors(logger: str = "flwr") -> None:
    """Install ``OneLineConfigErrors`` on ``logger`` (once)."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, OneLineConfigErrors) for f in target.filters):
        target.addFilter(OneLineConfigErrors())
