"""``python -m deploy.site --check``: a site checks its paths, its policy and its own
data against a run config without joining; and a site that would join with a path
that does not exist stops before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.site import main
from pflower.flower_lines import fleet_over_http
from tests.helpers import image_folder

RUN = "method='fedper' model='cnn4' class-names='bright,dark' input-shape='3,16,16'"


def folder(root: Path, classes: tuple[str, ...], side: int = 16) -> Path:
    return image_folder(root, classes, per_class=4, side=side)


def check(tmp_path: Path, data: Path, run: str = RUN, *extra: str) -> int:
    """deploy.site's exit status for ``--check`` of this site against ``run``."""
    argv = ["--check", "--site", "site-a", "--data-path", str(data)]
    argv += ["--state-dir", str(tmp_path / "state"), "--run-config", run, *extra]
    try:
        main(argv)
        return 0
    except SystemExit as err:
        return int(err.code or 0)


def test_a_site_whose_data_fit_the_run_is_ready(tmp_path, capsys) -> None:
    data = folder(tmp_path / "data", ("bright", "dark"))
    assert check(tmp_path, data) == 0
    out = capsys.readouterr().out
    assert "label ids [0, 1] of the run's 2" in out and "site 'site-a': ready for this run" in out
    assert "classes bright->0 dark->1\n" in out  # the run's ids by name
    assert not (tmp_path / "state").exists()  # a check writes nothing on the site


def test_without_class_names_the_site_sees_which_folder_got_which_id(tmp_path, capsys) -> None:
    """#46: with num-classes only, the upper-case folder sorts first; the check says so."""
    data = folder(tmp_path / "data", ("Malignant", "benign"))
    run = RUN.replace("class-names='bright,dark'", "num-classes=2")
    assert check(tmp_path, data, run) == 0
    assert "classes Malignant->0 benign->1 (by this site's folder order)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("layout", "run", "extra", "named"),
    [
        # a class the run does not list: the silent label shift of #36, caught before joining
        (("bright", "dim"), RUN, (), "config key 'class-names'"),
        (("bright", "dark"), RUN.replace("3,16,16", "3,32,32"), (), "config key 'input-shape'"),
        (
            ("bright", "dark"),
            RUN.replace("fedper", "fedcp"),
            (),
            "site policy 'accept-disclosures'",
        ),
        (("bright", "dark"), RUN, ("--allowed-methods", "fedavg"), "site policy 'allowed-methods'"),
        (("bright", "dark"), RUN + " alpha=-1", (), "config key 'alpha'"),
        (("bright", "dark"), RUN, ("--device", "cuda:7"), "--device cuda:7"),
        (("bright", "dark"), RUN, ("--auth-key", "/no/key"), "--auth-key /no/key"),
    ],
)
def test_what_does_not_fit_is_one_line_and_exit_2(
    tmp_path, capsys, layout, run, extra, named
) -> None:
    data = folder(tmp_path / "data", layout)
    assert check(tmp_path, data, run, *extra) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("site check FAILED:") and named in err[0], err


def test_a_missing_data_path_stops_the_site_before_it_joins(tmp_path, capsys) -> None:
    argv = ["--superlink", "127.0.0.1:1", "--insecure", "--site", "a"]
    argv += ["--data-path", str(tmp_path / "nope"), "--state-dir", str(tmp_path / "s")]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "--data-path" in capsys.readouterr().err and not (tmp_path / "s").exists()


# ---- --check --connect: reach the SuperLink without joining (#46) ----------------------


@pytest.fixture(scope="module")
def tls_endpoint(tmp_path_factory):
    """The installed Flower line's Fleet endpoint with TLS: gRPC (1.39; no services:
    readiness is all --connect asks for) or HTTPS answering /health (1.42), its
    certificates from deploy/make_certs.sh, and a second CA that did not sign it."""
    import subprocess
    from concurrent import futures

    import grpc

    root = tmp_path_factory.mktemp("pki")
    make = Path(__file__).resolve().parents[1] / "deploy" / "make_certs.sh"
    for name in ("ours", "other"):
        done = subprocess.run(["bash", str(make), str(root / name)], capture_output=True)
        assert done.returncode == 0, done.stderr
    if fleet_over_http():
        server = _health_server({"status": 200}, tls=root / "ours")
        yield f"127.0.0.1:{server.server_address[1]}", root / "ours/ca.crt", root / "other/ca.crt"
        server.shutdown()
        return
    creds = grpc.ssl_server_credentials(
        [((root / "ours/server.key").read_bytes(), (root / "ours/server.pem").read_bytes())]
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    yield f"127.0.0.1:{port}", root / "ours/ca.crt", root / "other/ca.crt"
    server.stop(None)


def _health_server(answer: dict[str, int], tls: Path | None = None):
    """An HTTP(S) server in a thread that answers ``/health`` with ``answer["status"]``
    (200: what flwr 1.42's SuperLink says) and anything else with 404; ``tls``: the
    make_certs.sh folder whose server certificate it presents."""
    import http.server
    import ssl
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(answer["status"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls / "server.pem", tls / "server.key")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_completes_tls_and_reaches_the_endpoint(tmp_path, capsys, tls_endpoint) -> None:
    address, ca, _ = tls_endpoint
    data = folder(tmp_path / "data", ("bright", "dark"))
    link = ["--connect", "--superlink", address, "--root-certificates", str(ca)]
    assert check(tmp_path, data, RUN, *link) == 0
    out = capsys.readouterr().out
    assert f"ok: SuperLink {address} (127.0.0.1) reachable: TLS" in out
    endpoint = "its Fleet HTTP endpoint is up" if fleet_over_http() else "its gRPC endpoint is up"
    assert "with ca.crt" in out and endpoint in out


@pytest.mark.parametrize("case", ["wrong CA", "closed port", "unresolvable"])
def test_connect_names_the_step_that_fails_in_one_line(tmp_path, capsys, tls_endpoint, case):
    address, ca, other = tls_endpoint
    data = folder(tmp_path / "data", ("bright", "dark"))
    superlink, cert, says = {
        "wrong CA": (address, other, "does not verify against"),
        "closed port": (f"127.0.0.1:{_free_port()}", ca, "not reachable"),
        "unresolvable": ("no-such-superlink.invalid:9092", ca, "cannot resolve"),
    }[case]
    link = ["--connect", "--superlink", superlink, "--root-certificates", str(cert)]
    assert check(tmp_path, data, RUN, *link) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("site check FAILED: --superlink") and says in err[0]


@pytest.mark.parametrize("probe, says", [("grpc", "gRPC"), ("http", "HTTP")])
def test_connect_says_when_tcp_works_but_nothing_answers(probe: str, says: str) -> None:
    """A port that accepts and stays silent (not the Fleet API): the probe of either
    Flower line (1.39's gRPC channel, 1.42's /health) names what did not answer."""
    import socket

    from deploy import site_check

    endpoint_up = getattr(site_check, f"{probe}_endpoint_up")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(site_check.SiteCheckFailed, match=f"no {says} endpoint answered"):
            endpoint_up(f"127.0.0.1:{port}", None, timeout=1.0)


@pytest.fixture
def http_superlink():
    answer = {"status": 200}
    server = _health_server(answer)
    yield f"127.0.0.1:{server.server_address[1]}", answer
    server.shutdown()


def test_the_http_probe_of_flower_142_asks_health_and_names_a_wrong_answer(
    http_superlink,
) -> None:
    from deploy.site_check import SiteCheckFailed, http_endpoint_up

    address, answer = http_superlink
    assert http_endpoint_up(address, None, timeout=5) == "its Fleet HTTP endpoint is up"
    answer["status"] = 503
    with pytest.raises(SiteCheckFailed, match="answered /health with 503"):
        http_endpoint_up(address, None, timeout=5)
