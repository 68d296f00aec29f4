"""``python -m deploy.site --check --run-config "..."``: what a site would do with a
run, done here once, without joining any federation.

It checks the site's paths (data, state directory, certificates, key, device),
then the run config as the ClientApp will read it, the site's own policy against
that run, and finally the site's data: it loads them as the ClientApp will (its
class list mapped through the run's ``class-names``, its shape against
``input-shape``), builds the method's model and passes a batch through it. Each
check prints one line; the first failure ends the check with one line naming
the path, key or policy, and exit status 2.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pflower.config.node import NodeConfig
from pflower.flower_lines import default_fleet_port, fleet_over_http

PROJECT = Path(__file__).resolve().parents[1]


class SiteCheckFailed(RuntimeError):
    """One line: what does not fit."""


def path_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the site's paths and device (empty: nothing)."""
    problems = []
    if args.data_path and not Path(args.data_path).expanduser().exists():
        problems.append(f"--data-path {args.data_path}: does not exist")
    state = Path(args.state_dir).expanduser()
    parent = state if state.exists() else next((p for p in state.parents if p.exists()), None)
    if parent is None or not os.access(parent, os.W_OK):
        problems.append(f"--state-dir {args.state_dir}: cannot be created or written")
    if args.root_certificates:
        cert = Path(args.root_certificates).expanduser()
        text = cert.read_text(errors="replace") if cert.is_file() else ""
        if "-----BEGIN CERTIFICATE-----" not in text:
            problems.append(
                f"--root-certificates {args.root_certificates}: not a readable PEM certificate"
            )
    if args.auth_key:
        problems += _key_problems(Path(args.auth_key).expanduser())
    if args.device:
        problems += _device_problems(args.device)
    return problems


def _key_problems(path: Path) -> list[str]:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    try:
        key = load_ssh_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        return [f"--auth-key {path}: not a readable OpenSSH private key ({err})"]
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return [f"--auth-key {path}: Flower's node authentication needs an ECDSA key"]
    return []


def _device_problems(device: str) -> list[str]:
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        return [f"--device {device}: {err}"]
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if (dev.index or 0) >= count:
            return [f"--device {device}: this machine has {count} CUDA device(s)"]
    return []


def run_config(text: str) -> dict[str, Any]:
    """The run config the ClientApp would read: the app's defaults (pyproject.toml,
    where this is a checkout) with ``text`` (``--run-config`` syntax) on top."""
    from flwr.common.config import parse_config_args

    from pflower.cli.preflight import flwr_run_config

    if (PROJECT / "pyproject.toml").is_file():
        return flwr_run_config(PROJECT, [text] if text else [])
    return parse_config_args([text] if text else None)


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The node config ``deploy.site`` gives the SuperNode, as the ClientApp reads it
    (ConfigError naming a bad key or value)."""
    from flwr.common.config import parse_config_args

    from deploy.node_config import node_config as as_text
    from deploy.node_config import node_values

    return NodeConfig.of(parse_config_args([as_text(node_values(args))]))


def check_site(args: argparse.Namespace, say: Any = print) -> None:
    """Every check, one line each; SiteCheckFailed with one line on the first failure."""
    from pflower.config.schema import ConfigError

    problems = path_problems(args)
    if problems:
        raise SiteCheckFailed(problems[0])
    say(f"ok: paths (data {args.data_path or '-'}, state {args.state_dir})")
    from client_app.app import policy_refusal
    from methods import parse_run_config

    try:
        node = node_config(args)
    except ConfigError as err:
        raise SiteCheckFailed(str(err)) from None
    try:  # the site's own column names replace the run's, as its ClientApp does
        cfg = parse_run_config({**run_config(args.check_run_config), **node.site_data})
    except ConfigError as err:
        raise SiteCheckFailed(f"run config: {err}") from None
    refusal = policy_refusal(node, cfg, "train", masked=cfg.secure_aggregation)
    if refusal:
        raise SiteCheckFailed(refusal)
    say(f"ok: run config (method {cfg.method}) and this site's policy allows it")
    say(f"ok: {check_data(cfg, args.site, args.data_path)}")
    if args.connect:
        say(f"ok: {check_connection(args.superlink, args.root_certificates or None)}")


def check_connection(superlink: str, root_certificates: str | None, timeout: float = 10.0) -> str:
    """Reach the SuperLink's Fleet API without joining: resolve its name, open TCP,
    complete the TLS handshake against ``root_certificates`` (None: --insecure), then
    wait until its gRPC endpoint is ready (HTTP/2 up; no RPC is called, so the site
    registers nothing). SiteCheckFailed names the step that failed."""
    import socket
    import ssl

    host, _, port_text = superlink.rpartition(":")
    host = host.strip("[]")
    where = f"--superlink {superlink}"
    if not host or not port_text.isdigit():
        raise SiteCheckFailed(
            f"{where}: give HOST:PORT (the Fleet API, {default_fleet_port()} by default)"
        )
    port = int(port_text)
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as err:
        raise SiteCheckFailed(f"{where}: cannot resolve {host!r} ({err.strerror})") from None
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise SiteCheckFailed(f"{where}: {address} port {port} not reachable ({why})") from None
    tls = "no TLS (--insecure)"
    with sock:
        if root_certificates:
            context = ssl.create_default_context(cafile=root_certificates)
            # what the Fleet API speaks: gRPC's HTTP/2 (1.39), HTTP/1.1 (1.42)
            context.set_alpn_protocols(["http/1.1"] if fleet_over_http() else ["h2"])
            try:
                with context.wrap_socket(sock, server_hostname=host) as conn:
                    subject = dict(x[0] for x in conn.getpeercert().get("subject", ()))
                    tls = (
                        f"{conn.version()} with {Path(root_certificates).name}, the "
                        f"certificate of {subject.get('commonName', host)!r} valid until "
                        f"{conn.getpeercert().get('notAfter')}"
                    )
            except ssl.SSLCertVerificationError as err:
                raise SiteCheckFailed(
                    f"{where}: TLS: the server's certificate does not verify against "
                    f"{root_certificates} ({err.verify_message})"
                ) from None
            except (ssl.SSLError, OSError) as err:
                raise SiteCheckFailed(f"{where}: TLS handshake failed ({err})") from None
    if fleet_over_http():  # flwr 1.42: the Fleet API is HTTP on the SuperLink's port
        endpoint = http_endpoint_up(superlink, root_certificates, timeout)
    else:
        endpoint = grpc_endpoint_up(superlink, root_certificates, timeout)
    return f"SuperLink {superlink} ({address}) reachable: {tls}; {endpoint}"


def grpc_endpoint_up(superlink: str, root_certificates: str | None, timeout: float) -> str:
    """Wait until a gRPC endpoint at ``superlink`` is ready (HTTP/2 up, no RPC called)."""
    import grpc

    if root_certificates:
        creds = grpc.ssl_channel_credentials(Path(root_certificates).read_bytes())
        channel = grpc.secure_channel(superlink, creds)
    else:
        channel = grpc.insecure_channel(superlink)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        raise SiteCheckFailed(
            f"--superlink {superlink}: TCP{' and TLS' if root_certificates else ''} work, but "
            f"no gRPC endpoint answered within {timeout:.0f}s (is this the SuperLink's Fleet "
            "API port?)"
        ) from None
    finally:
        channel.close()
    return "its gRPC endpoint is up"


def http_endpoint_up(superlink: str, root_certificates: str | None, timeout: float) -> str:
    """Ask the SuperLink's HTTP API at ``superlink`` for ``/health`` (it registers
    nothing); any answer but 200 names what came back."""
    import ssl
    import urllib.error
    import urllib.request

    scheme = "https" if root_certificates else "http"
    context = ssl.create_default_context(cafile=root_certificates) if root_certificates else None
    where = f"--superlink {superlink}"
    try:
        with urllib.request.urlopen(
            f"{scheme}://{superlink}/health", timeout=timeout, context=context
        ) as reply:
            status = reply.status
    except urllib.error.HTTPError as err:
        status = err.code
    except (urllib.error.URLError, OSError) as err:
        why = getattr(err, "reason", err)
        raise SiteCheckFailed(
            f"{where}: TCP{' and TLS' if root_certificates else ''} work, but no HTTP endpoint "
            f"answered ({why}; is this the SuperLink's port, 8000 by default?)"
        ) from None
    if status != 200:
        raise SiteCheckFailed(
            f"{where}: an HTTP endpoint answered /health with {status}, not a SuperLink's 200"
        )
    return "its Fleet HTTP endpoint is up"


def check_data(cfg: Any, site: str, data_path: str) -> str:
    """Load the site's data as its ClientApp will, build the model, pass a batch."""
    import torch

    from pflower.cli.preflight import model_checks
    from pflower.config.schema import ConfigError
    from pflower.data import (
        check_site_data,
        class_ids,
        data_info,
        load_client_data,
        run_class_names,
        site_class_names,
    )

    where = f"site '{site}'"
    import datasets

    datasets.disable_progress_bars()  # each check is one line
    try:
        info = data_info(cfg, data_path)  # no cache_dir: nothing written to the state dir
        data = load_client_data(cfg, 0, 1, data_path)
        check_site_data(cfg, data, where)
        model_checks(cfg, info, data)  # the pre-flight's: build the model, pass a batch
    except ConfigError as err:
        raise SiteCheckFailed(str(err).split("invalid run config: ")[-1]) from None
    except Exception as err:  # noqa: BLE001 - the first crash the ClientApp would have
        line = (str(err).strip().splitlines() or [type(err).__name__])[0][:240]
        if "config key '" not in line:
            line = f"data {data_path or cfg.dataset!r}: {line}"
        raise SiteCheckFailed(line) from None
    shape = "x".join(map(str, data.x_train.shape[1:]))
    classes = sorted(set(torch.cat([data.y_train, data.y_test]).tolist()))
    # which of this site's class names gets which id: without class-names, the other
    # sites must number theirs the same (the server compares them before round 1)
    ids = class_ids(cfg, site_class_names(cfg, 0, 1, data_path))
    named = " ".join(f"{n}->{i}" for n, i in ids.items())
    unnamed = "" if run_class_names(cfg) or not ids else " (by this site's folder order)"
    return (
        f"data: {data.num_train} training and {len(data.y_test)} test samples of {shape}, "
        f"label ids {classes} of the run's {info.num_classes}; model '{cfg.model}' takes them"
        + (f"; classes {named}{unnamed}" if named else "")
    )
