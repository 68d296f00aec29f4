"""What a method's protocol reveals beyond its shared tensors.

Each method declares its disclosures (``Method.disclosures``, a function of the
run config): the kind (a ``DisclosureKind`` its package declares), which personal
tensors it reveals (fnmatch patterns over the names a client's
``personal_tensors()`` gives), and the run keys that cause it. The content audit (tests/test_wire_audit.py) checks the declarations against
what can really be rebuilt from the wire; a site's policy (pflower/privacy/policy.py)
refuses the kinds it has not accepted; docs/PRIVACY.md's table is generated from
them (``python -m pflower.cli.disclosures``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DisclosureKind:
    """A kind of disclosure, declared by the method whose protocol makes it (on its
    card's ``disclosure_kinds``): the name a site's policy accepts, and what the
    server (or, for whole-model, other sites) learns."""

    name: str
    what: str


# not declared by a method: what a site under require-secure-aggregation withholds
# unless it accepts it (every method's replies carry it; the table's metadata column)
METRICS = DisclosureKind(
    "metrics",
    "the site's own per-round numbers in plain text beside its masked upload: "
    "training loss, its scores on its test split, its device",
)


@dataclass(frozen=True)
class Disclosure:
    """One thing beyond the shared tensors that a run sends off the site."""

    of: DisclosureKind
    tensors: tuple[str, ...]  # fnmatch patterns over the personal tensors revealed
    run_keys: str  # the run config that causes it, as a user would write it
    audited: bool = True  # False: the in-process audit cannot run this mode (SecAgg+)

    @property
    def kind(self) -> str:
        return self.of.name

    @property
    def what(self) -> str:
        return self.of.what
