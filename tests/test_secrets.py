"""Each part of a deployment gets only its own secrets (#32): the certificate script
states validity and refuses an expiring CA, every site has its own SuperExec secret,
and no container that runs submitted code mounts a private key. The compose
end-to-end (scripts/compose_test.sh, CI) checks the same inside running containers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
CERTS = REPO / "deploy" / "make_certs.sh"


def _make(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CERTS), str(out), *args], capture_output=True, text=True)


def test_certificates_state_their_validity_and_sites_get_their_own_secret(tmp_path) -> None:
    made = _make(tmp_path, "--nodes", "site-a,site-b", "--days", "30")
    assert made.returncode == 0, made.stderr
    assert made.stdout.count("notAfter=") == 2  # the CA's and the SuperLink's
    secrets = {p.name: p.read_text() for p in (tmp_path / "secrets").iterdir()}
    assert sorted(secrets) == ["site-a.secret", "site-b.secret"]
    server = (tmp_path / "superexec.secret").read_text()
    assert len({server, *secrets.values()}) == 3 and all(len(s) == 64 for s in secrets.values())
    again = _make(tmp_path, "--nodes", "site-a")  # the valid CA is reused, the secrets kept
    assert (
        again.returncode == 0
        and (tmp_path / "secrets" / "site-a.secret").read_text() == (secrets["site-a.secret"])
    )


def test_an_expiring_ca_is_refused_not_reused(tmp_path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-nodes", "-keyout",
         str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt"), "-subj", "/CN=old"],
        check=True, capture_output=True,
    )  # fmt: skip
    made = _make(tmp_path)
    assert made.returncode == 1
    assert "has expired or expires within a day" in made.stderr
    assert not (tmp_path / "server.pem").exists()


def _mounts(compose: str, service: str) -> list[str]:
    doc = yaml.safe_load((DOCKER / compose).read_text())
    # the source: up to the first ':' outside a ${VAR:-default}
    return [
        re.match(r"((?:\$\{[^}]*\}|[^:$])+)", v).group(1)
        for v in doc["services"][service]["volumes"]
    ]


@pytest.mark.parametrize(
    ("compose", "service", "allowed"),
    [
        ("compose.server.yml", "superexec-serverapp", {"ca.crt", "superexec.secret"}),
        ("compose.yml", "superexec-serverapp", {"ca.crt", "superexec.secret"}),
        (
            "compose.server.yml",
            "superlink",
            {"ca.crt", "server.pem", "server.key", "superexec.secret"},
        ),
        ("compose.client.yml", "superexec-clientapp", {"superexec.secret"}),
        # SecAgg+ with a roster: the ClientApp signs its keys with the site's own
        ("compose.client.secagg.yml", "superexec-clientapp", {"${SITE}"}),
        ("compose.yml", "superexec-clientapp-a", {"site-a.secret"}),
    ],
)
def test_each_container_mounts_only_its_own_secrets(compose, service, allowed) -> None:
    certs = [m for m in _mounts(compose, service) if "certs" in m.lower()]
    assert certs and {Path(m).name for m in certs} == allowed, certs
    assert not any(m.endswith(("/certs", "CERTS_DIR:-./certs}")) for m in certs)  # no whole dir


def test_the_demo_sites_each_have_their_own_superexec_secret() -> None:
    secrets = {
        site: [m for m in _mounts("compose.yml", f"supernode-{site}") if m.endswith(".secret")]
        for site in "abc"
    }
    assert all(secrets[s] == [f"./certs/secrets/site-{s}.secret"] for s in "abc")


def _wheel(path: Path, body: str) -> None:
    """A minimal valid wheel of package 'tinypkg' 1.0 whose module holds ``body``."""
    import base64
    import hashlib
    import zipfile

    files = {
        "tinypkg.py": body,
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files["tinypkg-1.0.dist-info/RECORD"] = "\n".join([*record, "tinypkg-1.0.dist-info/RECORD,,"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def test_the_image_build_refuses_a_wheel_whose_hash_does_not_match(tmp_path) -> None:
    """The Dockerfile's install step, run here: the hashes come from the wheelhouse as
    it was when the build started; a wheel swapped afterwards (another server on the
    port, a changed file) is refused."""
    import sys

    house = tmp_path / "wheels"
    house.mkdir()
    wheel = house / "tinypkg-1.0-py3-none-any.whl"
    _wheel(wheel, "VALUE = 'genuine'\n")
    pins = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "wheel_hashes.py"), str(house)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert pins.startswith("tinypkg==1.0 --hash=sha256:")
    (tmp_path / "wheel-hashes.txt").write_text(pins)
    dockerfile = (DOCKER / "app.Dockerfile").read_text()
    assert "--require-hashes --no-deps -r /opt/wheel-hashes.txt" in dockerfile

    def install(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(house),
             "--require-hashes", "--no-deps", "-r", str(tmp_path / "wheel-hashes.txt"),
             "--target", str(tmp_path / target)],
            capture_output=True, text=True,
        )  # fmt: skip

    assert install("good").returncode == 0
    assert (tmp_path / "good" / "tinypkg.py").read_text() == "VALUE = 'genuine'\n"
    _wheel(wheel, "VALUE = 'foreign'\n")  # same name and version, other bytes
    refused = install("bad")
    assert refused.returncode != 0 and "DO NOT MATCH THE HASHES" in refused.stderr
    assert not (tmp_path / "bad" / "tinypkg.py").exists()
