"""A method's mean in parts (its card's ``Method.means``): each shared array averaged
with its part's weights, then moved to by its part's server step. The streamed and
the held round both weigh and move by this one table, so they agree."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.roles import TensorSpec
from pflower.config.schema import RunConfig
from pflower.config.weighting import MeanPart

NDArrays = list[np.ndarray]


@dataclass(frozen=True)
class PartedMean:
    """Each shared array's part (``None``: no part names it: the run's rule, step 1)."""

    parts: tuple[MeanPart | None, ...]

    @classmethod
    def of(cls, spec: list[TensorSpec], means: tuple[MeanPart, ...]) -> PartedMean:
        """The parts of the arrays ``spec`` names, the first matching prefix winning."""
        first = lambda name: next((p for p in means if name.startswith(p.prefix)), None)  # noqa: E731
        return cls(tuple(first(s.name) for s in spec))

    def weight(self, num_examples: int, weighted: bool) -> float | list[float]:
        """A reply's weight: one number where every array takes the run's rule, else one
        per array (an ``equal`` part's arrays weigh 1 whatever the rule)."""
        rule = float(num_examples) if weighted else 1.0
        if all(p is None or p.weights == "rule" for p in self.parts):
            return rule
        return [1.0 if p is not None and p.weights == "equal" else rule for p in self.parts]

    def moved(self, before: NDArrays, mean: NDArrays, cfg: RunConfig, share: float) -> NDArrays:
        """The next global arrays: each array where its part's step takes it from its value
        ``before`` the round towards the round's ``mean`` (``share``: the replies kept over
        the federation's size), in float64, cast back to the array's dtype."""
        out = []
        for part, old, new in zip(self.parts, before, mean, strict=True):
            step = 1.0 if part is None or part.step is None else float(part.step(cfg, share))
            if step == 1.0 or new.dtype.kind not in "f":
                out.append(new)
                continue
            x = old.astype(np.float64)
            out.append((x + step * (new.astype(np.float64) - x)).astype(new.dtype))
        return out
