"""SecAgg+ a deviating server cannot undo: masks from a PRF of the whole seed, a
protocol version both sides check, and neighbours' keys signed by roster sites."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)
from flwr.supercore.task_identity import TaskIdentity
from scipy.stats import chisquare

import pflower.patches
from client_app.app import PolicyRefusal, make_client_app
from pflower.privacy.secagg import (
    PROTOCOL_KEY,
    SIGNATURE_KEY,
    SIGNATURES_RECORD,
    key_statement,
    load_site_roster,
    neighbour_refusal,
    sign,
)

RUN = 7


def flower_generator() -> Any:
    pflower.patches.secagg_masks()
    return sys.modules["flwr.common.secure_aggregation.secaggplus_utils"]._flower_pseudo_rand_gen


# ---- the masks ------------------------------------------------------------------------------


def test_seeds_flower_folds_alike_give_different_masks() -> None:
    """Flower XORs a seed's 4-byte words into one 32-bit seed: two 32-byte seeds with
    two words swapped give it identical masks. The PRF keeps every bit."""
    seed = bytes(range(32))
    swapped = seed[4:8] + seed[:4] + seed[8:]
    shapes = [(64,), (3, 3)]
    old = [flower_generator()(s, 2**32, shapes) for s in (seed, swapped)]
    assert all(np.array_equal(a, b) for a, b in zip(*old, strict=True))
    new = [pflower.patches.mask_arrays(s, 2**32, shapes) for s in (seed, swapped)]
    assert not any(np.array_equal(a, b) for a, b in zip(*new, strict=True))
    # the same seed gives the same masks (both ends of a pair must agree)
    again = pflower.patches.mask_arrays(seed, 2**32, shapes)
    assert all(np.array_equal(a, b) for a, b in zip(new[0], again, strict=True))


@pytest.mark.parametrize("modulus", [2**32, 1000, 2**20 + 7])
def test_masks_are_uniform_over_the_modulus(modulus: int) -> None:
    (values,) = pflower.patches.mask_arrays(b"\x01" * 44, modulus, [(200_000,)])
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() < modulus
    bins = 50
    counts = np.bincount((values * bins // modulus).astype(np.int64), minlength=bins)
    assert chisquare(counts).pvalue > 1e-4, counts
    # the top of the range is drawn too (Flower's randint(0, num_range - 1) never does)
    assert values.max() >= modulus - modulus // 1000


def test_a_sum_of_masked_vectors_unmasks_to_the_plain_sum() -> None:
    """Three clients add their private and pairwise masks as Flower's mod does; the
    server removes the private masks from the seeds it reconstructs: the plain sum
    comes back exactly (pairwise masks cancel, mod 2**32)."""
    modulus, shapes = 2**32, [(5,), (2, 3)]
    rng = np.random.default_rng(0)
    plain = [[rng.integers(0, 1000, s) for s in shapes] for _ in range(3)]
    keys = [generate_key_pairs() for _ in range(3)]
    seeds = [bytes([i]) * 32 for i in range(3)]
    masked = []
    for i, vec in enumerate(plain):
        out = [v + m for v, m in zip(vec, pflower.patches.mask_arrays(seeds[i], modulus, shapes))]
        for j in range(3):
            if j == i:
                continue
            shared = generate_shared_key(keys[i][0], keys[j][1])
            pair = pflower.patches.mask_arrays(shared, modulus, shapes)
            out = [o + p if i > j else o - p for o, p in zip(out, pair, strict=True)]
        masked.append([np.mod(o, modulus) for o in out])
    total = [np.mod(sum(parts), modulus) for parts in zip(*masked, strict=True)]
    for seed in seeds:
        total = [
            np.mod(t - m, modulus)
            for t, m in zip(total, pflower.patches.mask_arrays(seed, modulus, shapes))
        ]
    expected = [sum(parts) for parts in zip(*plain, strict=True)]
    assert all(np.array_equal(t, e) for t, e in zip(total, expected, strict=True))


# ---- signed keys ----------------------------------------------------------------------------


def _identity(folder: Path, name: str) -> tuple[Path, Any]:
    key = ec.generate_private_key(ec.SECP384R1())
    private = folder / name
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    (folder / f"{name}.pub").write_bytes(public)
    return private, public


def _roster(folder: Path, sites: dict[str, int | None]) -> Path:
    lines = []
    for name, node in sites.items():
        _identity(folder, name)
        lines.append(f'[sites.{name}]\npublic-key = "{name}.pub"\n')
        if node is not None:
            lines.append(f"node-id = {node}\n")
    roster = folder / "roster.toml"
    roster.write_text("".join(lines))
    return roster


def _signed(
    folder: Path, signer: str, node: int, rnd: str = "1"
) -> tuple[tuple[bytes, bytes], bytes]:
    pks = (
        public_key_to_bytes(generate_key_pairs()[1]),
        public_key_to_bytes(generate_key_pairs()[1]),
    )
    return pks, sign(str(folder / signer), key_statement(RUN, rnd, node, *pks))


def test_neighbours_pass_only_with_roster_signatures_on_this_round(tmp_path: Path) -> None:
    roster = load_site_roster(str(_roster(tmp_path, {"a": 11, "b": 12, "c": None})))
    _identity(tmp_path, "server")  # the server's own key: not on the roster
    keys, sigs = {}, {}
    for site, node in (("a", 11), ("b", 12), ("c", 13)):
        keys[node], sigs[str(node)] = _signed(tmp_path, site, node)
    assert neighbour_refusal(roster, keys, sigs, RUN, "1", 3) is None
    # another round (a replay), another run: the signatures do not verify
    assert "not signed" in neighbour_refusal(roster, keys, sigs, RUN, "2", 3)
    assert "not signed" in neighbour_refusal(roster, keys, sigs, RUN + 1, "1", 3)
    # a registered site's key under another node id
    moved = {**keys, 99: keys[12]}
    moved.pop(12)
    sig_moved = {**sigs, "99": sigs["12"]}
    assert "node 99" in neighbour_refusal(roster, moved, sig_moved, RUN, "1", 2)
    # a neighbour the server made up, signed by the server's key, or not at all
    fake, fake_sig = _signed(tmp_path, "server", 14)
    with_fake = ({**keys, 14: fake}, {**sigs, "14": fake_sig})
    assert "node 14's keys are not signed" in neighbour_refusal(roster, *with_fake, RUN, "1", 3)
    unsigned = ({**keys, 14: fake}, sigs)
    assert "node 14 sent no signature" in neighbour_refusal(roster, *unsigned, RUN, "1", 3)
    # too few distinct roster sites for the policy
    two = ({11: keys[11], 12: keys[12]}, sigs)
    assert "2 distinct roster site(s)" in neighbour_refusal(roster, *two, RUN, "1", 3)
    assert neighbour_refusal(roster, *two, RUN, "1", 2) is None


def _message(content: RecordDict, node: int, monkeypatch: pytest.MonkeyPatch) -> Message:
    monkeypatch.setattr(TaskIdentity, "_run_id", RUN, raising=False)
    for attr in ("_node_id", "_task_id"):  # the server's
        monkeypatch.setattr(TaskIdentity, attr, 0, raising=False)
    return Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, group_id="1")


def _setup(node: int, monkeypatch: pytest.MonkeyPatch, protocol: str | None) -> Message:
    from tests.apps.eavesdrop.eavesdrop_app import setup_content

    return _message(setup_content(protocol), node, monkeypatch)


RUN_CONFIG = {"method": "fedavg", "secure-aggregation": True, "sim-samples": 40, "hidden-dim": 8}


@pytest.mark.parametrize("verifies", [False, True])
def test_a_server_that_plays_the_neighbours_gets_nothing_from_a_site_with_a_roster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verifies: bool
) -> None:
    """The server answers a site's set-up with two "neighbours" whose private keys it
    holds. Without a roster (Flower's SecAgg+, a site that does not require it) the
    site encrypts its shares of its mask seed and of its pairwise key to them: the
    server decrypts them and holds both secrets, i.e. everything needed to unmask the
    site's upload. With the roster the site refuses the round at that stage, sends no
    share, and logs why. (A site that requires SecAgg+ and has no roster answers
    nothing at all: the next test.)"""
    victim = 11
    _roster(tmp_path, {"victim": victim, "a": 12, "b": 13})
    node = {"site": "victim", "identity-key": str(tmp_path / "victim")}
    if verifies:
        node["secagg-roster"] = str(tmp_path / "roster.toml")
        node["require-secure-aggregation"] = "true"
    app = make_client_app(RUN_CONFIG)
    context = Context(
        run_id=RUN, node_id=victim, node_config=node, state=RecordDict(), run_config={}
    )
    setup = app(_setup(victim, monkeypatch, pflower.patches.SECAGG_PROTOCOL), context)
    got = setup.content.config_records[RECORD_KEY_CONFIGS]
    assert got[PROTOCOL_KEY] == pflower.patches.SECAGG_PROTOCOL
    own = (got[Key.PUBLIC_KEY_1], got[Key.PUBLIC_KEY_2])
    # the site's signature verifies against its roster key
    victim_roster = load_site_roster(str(tmp_path / "roster.toml"))
    assert (
        neighbour_refusal(
            victim_roster[:1], {victim: own}, {str(victim): got[SIGNATURE_KEY]}, RUN, "1", 1
        )
        is None
    )

    # the server makes up two neighbours, keeping their private keys
    fakes = {nid: (generate_key_pairs(), generate_key_pairs()) for nid in (12, 13)}
    share_keys = {str(victim): list(own)}
    share_keys |= {
        str(nid): [public_key_to_bytes(k1[1]), public_key_to_bytes(k2[1])]
        for nid, (k1, k2) in fakes.items()
    }
    content = RecordDict(
        {RECORD_KEY_CONFIGS: ConfigRecord({**share_keys, Key.STAGE: Stage.SHARE_KEYS})}
    )
    content.config_records[SIGNATURES_RECORD] = ConfigRecord({str(victim): got[SIGNATURE_KEY]})
    message = _message(content, victim, monkeypatch)
    if verifies:
        with pytest.raises(PolicyRefusal, match="node 12 sent no signature"):
            app(message, context)
        return
    reply = app(message, context).content.config_records[RECORD_KEY_CONFIGS]
    shares: dict[str, list[bytes]] = {"seed": [], "sk1": []}
    for dst, ciphertext in zip(
        reply[Key.DESTINATION_LIST], reply[Key.CIPHERTEXT_LIST], strict=True
    ):
        k2 = fakes[dst][1]
        key = generate_shared_key(k2[0], bytes_to_public_key(own[1]))
        _, _, seed_share, sk1_share = share_keys_plaintext_separate(decrypt(key, ciphertext))
        shares["seed"].append(seed_share)
        shares["sk1"].append(sk1_share)
    seed, sk1 = combine_shares(shares["seed"]), combine_shares(shares["sk1"])
    # the server now holds the site's mask seed and its pairwise private key
    state = context.state.config_records["secaggplus_state"]
    assert seed == state["rd_seed"] and sk1 == state["sk1"]
    assert private_key_to_bytes(bytes_to_private_key(sk1)) == sk1


def test_a_site_requiring_secagg_without_a_roster_answers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#93: the ClientApp itself refuses, whatever process hosts it (Flower's own
    flower-supernode included): a SecAgg+ set-up (its keys would let a server play its
    neighbours), a plain fit, an evaluation and a legacy get_parameters (its shared
    tensors in the clear) all raise before anything is computed. The development
    opt-in ``secagg-unverified-keys`` (deploy.site --unverified-secagg-keys) waives it."""
    from flwr.common import GetParametersIns
    from flwr.common.constant import MessageTypeLegacy
    from flwr.compat.common.recorddict_compat import getparametersins_to_recorddict

    _identity(tmp_path, "victim")
    node = {
        "site": "victim",
        "require-secure-aggregation": "true",
        "accept-disclosures": "metrics",
        "identity-key": str(tmp_path / "victim"),
    }
    app = make_client_app(RUN_CONFIG)

    def context(node: dict[str, str]) -> Context:
        return Context(run_id=RUN, node_id=11, node_config=node, state=RecordDict(), run_config={})

    setup = _setup(11, monkeypatch, pflower.patches.SECAGG_PROTOCOL)
    plain = _message(
        RecordDict({"fitins.config": ConfigRecord({"server-round": 1})}), 11, monkeypatch
    )
    params = _message(getparametersins_to_recorddict(GetParametersIns({})), 11, monkeypatch)
    params.metadata.message_type = MessageTypeLegacy.GET_PARAMETERS
    evaluate = _message(RecordDict(), 11, monkeypatch)
    evaluate.metadata.message_type = MessageType.EVALUATE
    for message in (setup, plain, params, evaluate):
        with pytest.raises(PolicyRefusal, match="'require-secure-aggregation' needs a roster"):
            app(message, context(node))
    # with a roster, a legacy get_parameters is still refused (the roster file is read
    # only at a SecAgg+ stage)
    rostered = {**node, "secagg-roster": str(tmp_path / "roster.toml")}
    with pytest.raises(PolicyRefusal, match="answers no 'get_parameters' message"):
        app(params, context(rostered))
    # the development opt-in: the set-up is answered (its keys, signed)
    reply = app(setup, context({**node, "secagg-unverified-keys": "true"}))
    assert SIGNATURE_KEY in reply.content.config_records[RECORD_KEY_CONFIGS]


def test_a_site_refuses_a_set_up_in_another_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server with Flower's own masks (no version) or another version: one line."""
    app = make_client_app(RUN_CONFIG)
    for protocol, said in ((None, "Flower's own"), ("pflower-secagg+/other/0", "other/0")):
        node = {"site": "h"}
        context = Context(
            run_id=RUN, node_id=11, node_config=node, state=RecordDict(), run_config={}
        )
        with pytest.raises(PolicyRefusal, match=f"'h' refuses .* speaks [^;]*{said}[^;]*; this"):
            app(_setup(11, monkeypatch, protocol), context)


# ---- in a loopback deployment: TLS, SuperNode authentication, roster-signed keys ------------


@pytest.mark.slow
@pytest.mark.flower142
def test_a_deployed_secure_run_completes_with_signed_keys_and_an_outsider_is_refused(
    tmp_path: Path,
) -> None:
    """Three roster sites, each requiring SecAgg+ and checking its neighbours' signed
    keys against its own copy of the roster: a secure run completes with the new
    masks. A fourth registered node, not on the roster, signs with its own key and
    joins the next run: every roster site refuses the round (its four participants
    are more than the roster's three sites) before any key, share or masked vector
    leaves it, and nothing is aggregated."""
    import json

    from deploy.roster import register
    from harness.loopback import BIN, LoopbackFederation

    sites = ["site-a", "site-b", "site-c"]
    with LoopbackFederation(tmp_path, tls=True, auth=True, isolation="process", warm=True) as fed:
        fed.make_certs([*sites, "outsider"])
        fed.start_superlink()
        roster = tmp_path / "roster.toml"
        roster.write_text("".join(f'[sites.{s}]\npublic-key = "pki/keys/{s}.pub"\n' for s in sites))
        register(roster, ["loopback"], str(BIN / "flwr"), fed.env(fed.cli_home))
        fed.register("outsider")
        nodes = {}
        for i, site in enumerate([*sites, "outsider"]):
            policy = {"accept-disclosures": "metrics", "identity-key": str(fed.key(site))}
            if site != "outsider":
                policy |= {"require-secure-aggregation": "true", "secagg-roster": str(roster)}
            nodes[site] = fed.start_supernode(
                site, i % 3, 3, tmp_path / f"state-{site}", key=fed.key(site), policy=policy
            )
            if site == sites[-1]:  # the first run has the roster sites only
                for name in sites:
                    fed.wait_for(lambda p=nodes[name]: "SuperNode ID" in p.text(), 120, name)
                config = {
                    "method": "fedavg",
                    "num-server-rounds": 2,
                    "sim-samples": 60,
                    "hidden-dim": 16,
                    "round-timeout": 60.0,
                    "min-available-clients": 3,
                    "secure-aggregation": True,
                    "output-dir": str(tmp_path / "out"),
                    "run-name": "signed",
                }
                run_id = fed.run(config)
                assert fed.wait_run(run_id, 900) == "finished:completed", fed.tail()
                res = json.loads((tmp_path / "out" / "signed" / "results.json").read_text())
                assert [r["replies"] for r in res["rounds"]] == [3, 3]
                assert sorted(res["rounds"][-1]["per_client_accuracy"]) == sites
                # the server unmasked only the sum, within the clipping range
                assert all(0 < r["secagg_aggregate_max_abs"] < 8.0 for r in res["rounds"])
                assert res["config"]["secure-aggregation"] is True
        fed.wait_for(lambda: "SuperNode ID" in nodes["outsider"].text(), 120, "outsider")
        run_id = fed.run({**config, "min-available-clients": 4, "run-name": "outsider"})
        fed.wait_run(run_id, 900)
        results = tmp_path / "out" / "outsider" / "results.json"
        rounds = json.loads(results.read_text())["rounds"] if results.exists() else []
        assert not any(r.get("replies") for r in rounds), rounds
        for site in sites:
            text = next(p for p in fed.procs if p.name == f"superexec-supernode-{site}").text()
            # four participants, three roster sites: refused at the set-up, before its
            # keys (let alone shares) go out; the neighbour check itself is tested above
            assert f"site '{site}' refuses this run by its policy: the SecAgg+ round " in text
            assert "claims 4 participants, more than the 3 sites on this site's roster" in text


def test_a_site_with_a_roster_refuses_a_round_claiming_more_sites_than_it_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Distributed DP sizes each noise share by the round's participant count: a
    server that claims more participants than the roster has sites is refused."""
    _roster(tmp_path, {"victim": 11, "a": 12})
    node = {"site": "victim", "secagg-roster": str(tmp_path / "roster.toml")}
    node["identity-key"] = str(tmp_path / "victim")
    app = make_client_app(RUN_CONFIG)
    context = Context(run_id=RUN, node_id=11, node_config=node, state=RecordDict(), run_config={})
    with pytest.raises(PolicyRefusal, match="claims 3 participants, more than the 2 sites"):
        app(_setup(11, monkeypatch, pflower.patches.SECAGG_PROTOCOL), context)
