"""The FedFac simulation study (paper Section 4.3.1, eq. 8).

Client c has covariates x_c = (x^p_c, x^s_c): personal ones x^p ~ N(mu_c, Sigma)
with Sigma_ij = 0.5^|i-j| and mu_c ~ N(0, I), shared ones x^s ~ N(0, I). The
teacher is a one-hidden-layer network of m neurons: the first m1 are personal
(w^pp_cq ~ N(mu_c, I), w^ps_cq ~ U(-0.1, 0.1), drawn per client), the last
m2 = round(p m) are shared (w^sp ~ U(-0.1, 0.1), w^ss ~ U(-1, 1), one draw for
all clients). y* = sum_j a_j relu(w_j' x) + eps, eps ~ N(0, c^2), y = 1[y* > 0]
(sigmoid(y*) > 0.5). The paper leaves the activation unnamed; ReLU matches the
MLP that fits the data.

Deviation: y* is centred at each client's median before thresholding. As
written, w^pp_cq ~ N(mu_c, I) aligns with the mean of x^p, so y* has one sign
for ~97% of a client's samples and the task is trivial; the paper names no
intercept, and a per-client one keeps the teacher's decision surface.

Two streams of draws: the study's one stream, client after client (the default, the
study every committed result used: client c's draws begin where client c-1's end, so
a process that serves some clients of many first passes over the stream once, a pass
that grows with the federation), or, with ``sim-client-streams``, each client's own stream,
seeded by (seed, c): any client drawn alone at once, a million clients as cheap as
ten (another draw of the same study: the same distributions, other numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class SimulationStudy:
    """A generated federation and its ground truth."""

    features: tuple[np.ndarray, ...]  # per client, (n, d) float32
    labels: tuple[np.ndarray, ...]  # per client, (n,) int64
    shared_neurons: np.ndarray  # (m,) bool: the true split of the hidden layer
    teacher_weights: tuple[np.ndarray, ...]  # per client, (m, d); () unless kept
    output_weights: np.ndarray | None = None  # (m,) a: the teacher's output layer


@dataclass(frozen=True)
class _Shape:
    """The generator's sizes: d1 personal and d2 shared covariates, m1 personal and m2
    shared neurons, n samples a client."""

    n: int
    d1: int
    d2: int
    m1: int
    m2: int

    @classmethod
    def of(
        cls, samples: int, dim: int, hidden: int, shared_neurons: float, shared_cov: float
    ) -> _Shape:
        d2 = int(round(shared_cov * dim))
        m2 = int(round(shared_neurons * hidden))
        return cls(samples, dim - d2, d2, hidden - m2, m2)


def _common(rng: np.random.Generator, k: _Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What every client shares, drawn first: the Cholesky factor of Sigma, the shared
    neurons' weights and the output layer a."""
    idx = np.arange(k.d1)
    sigma = 0.5 ** np.abs(idx[:, None] - idx[None, :])
    chol = np.linalg.cholesky(sigma) if k.d1 else np.zeros((0, 0))
    w_shared = np.concatenate(
        [rng.uniform(-0.1, 0.1, (k.m2, k.d1)), rng.uniform(-1.0, 1.0, (k.m2, k.d2))], axis=1
    )
    a = rng.standard_normal(k.m1 + k.m2)
    return chol, w_shared, a


def _client(
    rng: np.random.Generator,
    k: _Shape,
    common: tuple[np.ndarray, np.ndarray, np.ndarray],
    noise: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One client's (features, labels, teacher), drawn from ``rng`` where it stands.
    ``_skip_client`` consumes exactly the draws this makes."""
    chol, w_shared, a = common
    mu = rng.standard_normal(k.d1)
    w_personal = np.concatenate(
        [mu + rng.standard_normal((k.m1, k.d1)), rng.uniform(-0.1, 0.1, (k.m1, k.d2))], axis=1
    )
    w = np.concatenate([w_personal, w_shared], axis=0)  # personal neurons first
    x_p = mu + rng.standard_normal((k.n, k.d1)) @ chol.T
    x_s = rng.standard_normal((k.n, k.d2))
    x = np.concatenate([x_p, x_s], axis=1)
    y_star = np.maximum(x @ w.T, 0.0) @ a + noise * rng.standard_normal(k.n)
    return x.astype(np.float32), (y_star > np.median(y_star)).astype(np.int64), w


def _skip_client(rng: np.random.Generator, k: _Shape, scratch: np.ndarray) -> None:
    """Move ``rng`` past one client's draws without computing the client: its normal
    draws in the order ``_client`` makes them (a normal draw takes a varying number of
    words, so they are drawn, into ``scratch``); its uniform ones (one word each)
    skipped by advancing the bit generator."""
    rng.standard_normal(out=scratch[: k.d1 + k.m1 * k.d1])
    rng.bit_generator.advance(k.m1 * k.d2)
    rng.standard_normal(out=scratch[: k.n * (k.d1 + k.d2) + k.n])


class StudyArgs(NamedTuple):
    """``generate_simulation_study``'s arguments after the client count, every one given
    (a tuple: it unpacks into that call, and ``simulated_client`` takes it whole)."""

    samples_per_client: int
    dim: int
    hidden: int
    shared_neurons: float
    shared_covariates: float
    noise: float
    seed: int


CLIENT_STREAM = 94  # the per-client streams' seed is (seed, CLIENT_STREAM, client)


def client_stream(seed: int, client: int) -> np.random.Generator:
    """Client ``client``'s own stream (``sim-client-streams``)."""
    return np.random.default_rng([seed, CLIENT_STREAM, client])


@lru_cache(maxsize=4)
def _common_draws(
    shape: tuple[int, int, int, float, float], seed: int
) -> tuple[_Shape, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The study's shape (samples, dim, hidden, shared neurons, shared covariates) and
    what every client shares: the first draws of the seed's stream, the same in both
    kinds of streams."""
    k = _Shape.of(*shape)
    return k, _common(np.random.default_rng(seed), k)


@lru_cache(maxsize=4)
def generate_simulation_study(
    num_clients: int,
    samples_per_client: int = 400,
    dim: int = 100,
    hidden: int = 200,
    shared_neurons: float = 0.5,
    shared_covariates: float = 0.4,
    noise: float = 0.1,
    seed: int = 0,
    keep_teachers: bool = False,
    client_streams: bool = False,
) -> SimulationStudy:
    """Generate the heterogeneous federation of eq. (8), deterministic for a seed.
    The per-client teachers (m x d each: gigabytes for 10,000 clients) are kept only
    with ``keep_teachers``; the data are the same either way (and the same as
    ``simulated_client``'s, one client at a time). ``client_streams``: each client
    drawn from its own stream (``sim-client-streams``)."""
    rng = np.random.default_rng(seed)
    k = _Shape.of(samples_per_client, dim, hidden, shared_neurons, shared_covariates)
    common = _common(rng, k)
    xs, ys, teachers = [], [], []
    for c in range(num_clients):
        x, y, w = _client(client_stream(seed, c) if client_streams else rng, k, common, noise)
        xs.append(x)
        ys.append(y)
        if keep_teachers:
            teachers.append(w.astype(np.float32))
    truth = np.zeros(hidden, dtype=bool)
    truth[k.m1 :] = True
    return SimulationStudy(tuple(xs), tuple(ys), truth, tuple(teachers), common[2])


@dataclass(frozen=True)
class _Index:
    """Where each client's draws begin in the study's stream (its bit generator's
    state), so one client is drawn alone: 16 bytes a client, not its data."""

    shape: _Shape
    common: tuple[np.ndarray, np.ndarray, np.ndarray]
    states: np.ndarray  # (clients, 2) uint64: the PCG64 state's high and low words
    inc: int  # the PCG64 increment, the same for every client


@lru_cache(maxsize=4)
def _index(
    num_clients: int,
    samples_per_client: int,
    dim: int,
    hidden: int,
    shared_neurons: float,
    shared_covariates: float,
    seed: int,
) -> _Index:
    rng = np.random.default_rng(seed)
    k = _Shape.of(samples_per_client, dim, hidden, shared_neurons, shared_covariates)
    common = _common(rng, k)
    scratch = np.empty(max(k.d1 + k.m1 * k.d1, k.n * (k.d1 + k.d2 + 1)))
    states = np.empty((num_clients, 2), dtype=np.uint64)
    inc = int(rng.bit_generator.state["state"]["inc"])
    for c in range(num_clients):
        state = int(rng.bit_generator.state["state"]["state"])
        states[c] = (state >> 64, state & (2**64 - 1))
        _skip_client(rng, k, scratch)
    return _Index(k, common, states, inc)


def simulated_client(
    client: int, num_clients: int, study: StudyArgs, client_streams: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client``'s (features, labels) of ``generate_simulation_study``'s
    federation (``study``: its arguments after the client count), drawn alone: a
    process that serves some of 100,000 clients keeps 16 bytes a client (where its
    draws begin), not every client's data (1.6 GB at 40 samples of 100 covariates);
    with ``client_streams``, nothing a client (its stream is seeded by its number)."""
    *shape, _, seed = study  # the index does not depend on the noise
    if client_streams:
        k, common = _common_draws(tuple(shape), seed)
        x, y, _ = _client(client_stream(seed, client), k, common, study.noise)
        return x, y
    index = _index(num_clients, *shape, seed)
    high, low = (int(w) for w in index.states[client])
    bits = np.random.PCG64()
    bits.state = {
        "bit_generator": "PCG64",
        "state": {"state": (high << 64) | low, "inc": index.inc},
        "has_uint32": 0,
        "uinteger": 0,
    }
    x, y, _ = _client(np.random.Generator(bits), index.shape, index.common, study.noise)
    return x, y


def label_share_of_shared_neurons(study: SimulationStudy) -> dict[str, float]:
    """How much of the label the shared neurons carry, from a study generated with
    ``keep_teachers``: the share of var(y*) from the shared neurons' terms (mean over
    clients), and the accuracy of thresholding each part alone at its median (the
    best a model of only that part could do, noise aside)."""
    shared = study.shared_neurons
    a = study.output_weights
    if a is None or not study.teacher_weights:
        raise ValueError("generate the study with keep_teachers=True")
    share, acc_shared, acc_personal = [], [], []
    for x, y, w in zip(study.features, study.labels, study.teacher_weights):
        h = np.maximum(x.astype(np.float64) @ w.T, 0.0) * a
        hs, hp = h[:, shared].sum(axis=1), h[:, ~shared].sum(axis=1)
        share.append(np.var(hs) / (np.var(hs) + np.var(hp)))
        acc_shared.append(np.mean((hs > np.median(hs)) == y))
        acc_personal.append(np.mean((hp > np.median(hp)) == y))
    return {
        "variance_share_shared": float(np.mean(share)),
        "accuracy_shared_part_alone": float(np.mean(acc_shared)),
        "accuracy_personal_part_alone": float(np.mean(acc_personal)),
    }


if __name__ == "__main__":  # python -m pflower.data.synthetic: the table in docs/main_job.md
    print(
        "| p (shared neurons) | alpha (shared covariates) | var share of shared | "
        "shared part alone | personal part alone |"
    )
    print("|---|---|---|---|---|")
    for p, alpha in ((0.5, 0.4), (0.8, 0.4), (0.5, 0.8), (0.8, 0.8), (0.95, 0.8)):
        study = generate_simulation_study(
            100, 400, shared_neurons=p, shared_covariates=alpha, keep_teachers=True
        )
        r = label_share_of_shared_neurons(study)
        print(
            f"| {p} | {alpha} | {r['variance_share_shared']:.3f} | "
            f"{r['accuracy_shared_part_alone']:.3f} | {r['accuracy_personal_part_alone']:.3f} |"
        )
