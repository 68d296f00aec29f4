"""What a method's protocol reveals beyond its shared tensors.

Each method declares its disclosures (``Method.disclosures``, a function of the
run config): the kind, which personal tensors it reveals (fnmatch patterns over
the names a client's ``personal_tensors()`` gives), and the run keys that cause
it. The content audit (tests/test_wire_audit.py) checks the declarations against
what can really be rebuilt from the wire; a site's policy (pfl_privacy/policy.py)
refuses the kinds it has not accepted; docs/PRIVACY.md's table is generated from
them (``python -m pfl_privacy.table``).
"""

from __future__ import annotations

from dataclasses import dataclass

# kind -> what the server (or, for whole-model, other sites) learns
KINDS: dict[str, str] = {
    "head-blend": "the personal head, exactly: the upload is 0.5 h_g + 0.5 h_p and the "
    "server sent h_g, so h_p = 2 upload - h_g",
    "head-sum": "the sum of the round's personal heads (SecAgg+ unmasks only the sum of "
    "the blends, and the server knows h_g)",
    "matching-vector": "the personal factor v of the last layer before the head, as is "
    "(the server matches clients by it)",
    "personal-rows": "the current values of the rows that factor analysis marks personal, "
    "every round (and with fa-input=updates the values they started the round from)",
    "whole-model": "the whole personalised model (shared and personal tensors) to the "
    "server and the new clients (FedFac's Ensemble)",
    # not declared by a method: what a site under require-secure-aggregation withholds
    # unless it accepts it (every method's replies carry it; the table's metadata column)
    "metrics": "the site's own per-round numbers in plain text beside its masked upload: "
    "training loss, its scores on its test split, its device",
}


@dataclass(frozen=True)
class Disclosure:
    """One thing beyond the shared tensors that a run sends off the site."""

    kind: str  # a key of KINDS
    tensors: tuple[str, ...]  # fnmatch patterns over the personal tensors revealed
    run_keys: str  # the run config that causes it, as a user would write it
    audited: bool = True  # False: the in-process audit cannot run this mode (SecAgg+)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown disclosure kind {self.kind!r}, expected one of {KINDS}")

    @property
    def what(self) -> str:
        return KINDS[self.kind]
