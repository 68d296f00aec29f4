"""Iterated principal-factor analysis (docs/fedfac.md, paper Section 4.1).

Hand-written with numpy on purpose: ``factor_analyzer``'s ``method="principal"``
is one non-iterated principal-components fit (SVD of the standardised data), not
the iterated principal-factor method the paper describes, and sklearn's
``FactorAnalysis`` is maximum likelihood. The whole method is ~30 lines of
``numpy.linalg.eigh``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FactorResult:
    """The fit of one layer: loadings A (d x G), communalities nu (d,), G, iterations."""

    loadings: np.ndarray
    communalities: np.ndarray
    num_factors: int
    iterations: int


def site_median_correlation(per_client: list[np.ndarray]) -> np.ndarray:
    """``fedfac.fa-robust=site-median``: the correlation of the layer's columns from
    the element-wise median over clients of each client's own covariance, taken
    around the median of the clients' column means. With all clients alike it is the
    pooled correlation; one client's rows, however large or correlated, move a
    median of three or more only within the others' range."""
    blocks = [w.reshape(w.shape[0], -1).T.astype(np.float64) for w in per_client]
    centre = np.median(np.stack([b.mean(axis=0) for b in blocks]), axis=0)
    cov = np.median(np.stack([(b - centre).T @ (b - centre) / b.shape[0] for b in blocks]), axis=0)
    std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    std[std == 0] = 1.0
    r = np.clip(cov / np.outer(std, std), -1.0, 1.0)
    np.fill_diagonal(r, 1.0)
    return r


def correlation(z: np.ndarray) -> np.ndarray:
    """Correlation matrix of the columns of ``z`` after standardisation. A constant
    column (zero variance) correlates with nothing and has unit variance."""
    z = np.asarray(z, dtype=np.float64)
    centred = z - z.mean(axis=0)
    std = centred.std(axis=0)
    std[std == 0] = 1.0
    standard = centred / std
    r = standard.T @ standard / z.shape[0]
    np.fill_diagonal(r, 1.0)
    return r


def num_factors(eigenvalues: np.ndarray, kappa: float) -> int:
    """G = the smallest m >= 1 with sum_{j<=m} gamma_j / sum_j gamma_j >= kappa
    (eigenvalues in descending order; m counts from 1, no off-by-one)."""
    gamma = np.clip(np.sort(eigenvalues)[::-1], 0.0, None)
    share = np.cumsum(gamma) / max(gamma.sum(), 1e-300)
    return int(np.searchsorted(share, kappa - 1e-12) + 1)


def _top_loadings(r: np.ndarray, g: int) -> np.ndarray:
    """sqrt(gamma) u for the top-``g`` eigenpairs (negative eigenvalues count as 0)."""
    gamma, u = np.linalg.eigh(r)
    order = np.argsort(gamma)[::-1][:g]
    return u[:, order] * np.sqrt(np.clip(gamma[order], 0.0, None))


def principal_factors(
    z: np.ndarray,
    kappa: float = 0.85,
    tol: float = 1e-6,
    max_iter: int = 200,
    r: np.ndarray | None = None,
) -> FactorResult:
    """Iterated principal-factor fit of the columns of ``z`` (samples x variables),
    or of the correlation matrix ``r`` when given.

    R = corr(z); G from kappa on R's eigenvalues; A from the top-G eigenpairs of R
    as sqrt(gamma) u; then Psi = diag(R - A A^T), refactor R - Psi, until Psi
    stops changing. Communalities are clipped to [0, 1] each step (a Heywood case
    would otherwise make a uniqueness negative).
    """
    r = correlation(z) if r is None else r
    g = num_factors(np.linalg.eigvalsh(r), kappa)

    def with_diagonal(m: np.ndarray, d: np.ndarray) -> np.ndarray:
        reduced = m.copy()
        np.fill_diagonal(reduced, d)
        return reduced

    a, psi, iterations = _refine(r, g, _top_loadings, with_diagonal, tol, max_iter)
    return FactorResult(a, 1.0 - psi, g, iterations)


def _refine(r: Any, g: int, top: Any, with_diagonal: Any, tol: float, max_iter: int) -> Any:
    """The iteration, for numpy arrays or torch tensors alike: A from R, then Psi =
    diag(R - A A^T) and A again from R with 1 - Psi on its diagonal, until Psi moves
    less than ``tol``. Returns (A, Psi, iterations)."""
    a = top(r, g)
    psi = (1.0 - (a**2).sum(axis=1)).clip(0.0, 1.0)
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - reported
        a = top(with_diagonal(r, 1.0 - psi), g)
        new_psi = (1.0 - (a**2).sum(axis=1)).clip(0.0, 1.0)
        done = bool(abs(new_psi - psi).max() < tol)
        psi = new_psi
        if done:
            break
    return a, psi, iterations


def shared_elements(communalities: np.ndarray, quantile: float) -> np.ndarray:
    """True where nu_j >= tau, tau the ``quantile`` of nu (elements are shared)."""
    tau = np.quantile(communalities, quantile)
    return communalities >= tau


def layer_matrix(per_client: list[np.ndarray]) -> np.ndarray:
    """Z for one layer: element j's flattened incoming weights z_kj, stacked over
    the K clients into column chi_j; shape (K * d_in, d_l)."""
    columns = [w.reshape(w.shape[0], -1).T for w in per_client]  # each (d_in, d_l)
    return np.concatenate(columns, axis=0)


def server_device() -> str | None:
    """The device the server's factor analysis runs on: CUDA when the server has one
    (torch, float64), else None (numpy, as on every CPU-only server)."""
    import torch

    return "cuda" if torch.cuda.is_available() else None


def principal_factors_torch(
    z: np.ndarray,
    kappa: float = 0.85,
    tol: float = 1e-6,
    max_iter: int = 200,
    r: np.ndarray | None = None,
    device: str = "cpu",
) -> FactorResult:
    """``principal_factors`` in torch on ``device``, float64 throughout: the same steps
    (correlation, G from kappa, top-G loadings sqrt(gamma) u, Psi iterated), so the
    communalities agree with numpy's to float64 rounding (tests/test_fedfac.py measures
    it). eigh's eigenvectors may differ in sign between libraries; loadings enter only
    squared, so communalities do not."""
    import torch

    if r is None:
        x = torch.as_tensor(np.asarray(z, dtype=np.float64), device=device)
        centred = x - x.mean(dim=0)
        std = centred.std(dim=0, unbiased=False)
        std = torch.where(std == 0, torch.ones_like(std), std)
        standard = centred / std
        rt = standard.T @ standard / x.shape[0]
        rt.fill_diagonal_(1.0)
    else:
        rt = torch.as_tensor(r, dtype=torch.float64, device=device)
    g = num_factors(torch.linalg.eigvalsh(rt).cpu().numpy(), kappa)

    def top(m: torch.Tensor, g: int) -> torch.Tensor:
        gamma, u = torch.linalg.eigh(m)
        order = torch.argsort(gamma, descending=True)[:g]
        return u[:, order] * gamma[order].clamp_min(0.0).sqrt()

    def with_diagonal(m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        reduced = m.clone()
        reduced.diagonal().copy_(d)
        return reduced

    a, psi, iterations = _refine(rt, g, top, with_diagonal, tol, max_iter)
    return FactorResult(a.cpu().numpy(), (1.0 - psi).cpu().numpy(), g, iterations)
