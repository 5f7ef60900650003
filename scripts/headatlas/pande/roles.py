"""Pande et al.'s roles by name: the one registry (shared methods §1.2).

``ROLES`` maps each role to its :class:`Role`, in the order of the score columns (the scores file, the rows of
``heads.tsv``): that order is written here and nowhere else. A role's sieve (the keys a query's attention is
summed over) is one of four kinds, which the reducer (:mod:`headatlas.pande.reducers`) computes by name, with
the maps and without them (map-free):

- :class:`Band`: fixed key offsets j - i around the query (cut to j <= i under a causal mask);
- :class:`Keys`: the special tokens of some kinds ([CLS]/BOS, [SEP]), as groups whose masses add up;
- :class:`Block`: the content tokens of the query's own segment (pair inputs only), times the row's entropy
  with ``block_entropy``;
- :class:`Arcs`: dependency pairs of the configured relations; expands to the union and one role per relation
  (``syntactic``, ``syntactic_<rel>``), after the other roles.

``main`` is a role's place among the paper's four role families (1 first, 0: not one of them): the figures
list the main roles first in that order, then the others in registry order. The atlas and the ablation, which
may not import this package, keep their copy of the main roles (``atlas.analysis.PANDE_ROLES_MAIN``, the
ablation's ``pande_roles`` default in its schema); tests/unit/pande/test_roles.py checks both against :func:`main_roles`.

Adding a role whose sieve is one of these kinds is one entry here plus its docs (docs/architecture.md, "Add a
Pande role"; docs/pande.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP
from ..core.patterns import local_band

CLS_GROUP = (SPECIAL_CLS, SPECIAL_BOS)  # a decoder's BOS plays [CLS]'s part
SEP_GROUP = (SPECIAL_SEP,)


@dataclass(frozen=True)
class Band:
    """Keys at fixed offsets j - i from the query; ``None``: -window..+window of the settings (``local_window``)."""

    offsets: tuple[int, ...] | None = None

    def keys(self, window: int, causal: bool) -> list[int]:
        """The offsets of this band (j <= i under a causal mask), in increasing order."""
        if self.offsets is None:
            return list(local_band(window, causal))
        return sorted({o for o in self.offsets if not causal or o <= 0})


@dataclass(frozen=True)
class Keys:
    """Special tokens, as groups of special kinds whose attention masses add up (in this order)."""

    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Block:
    """The content tokens of the query's own segment (pair inputs only); a special token takes the segment of
    the next content token (:func:`headatlas.pande.sieves.query_segment`). With ``block_entropy`` the score is
    multiplied by the row's entropy (nats)."""


@dataclass(frozen=True)
class Arcs:
    """The pieces of the other word of each dependency pair of the configured relations
    (:func:`headatlas.pande.sieves.dependency_pairs`, ``direction``)."""


@dataclass(frozen=True)
class Role:
    sieve: Band | Keys | Block | Arcs
    label: str  # the sieve in words (docs/pande.md's table)
    empty: str = ""  # why no query has the sieve on a corpus ({corpus}, {model_kind}); "" for the generic note
    main: int = 0  # place among the paper's four role families (figures first, atlas markers); 0: not one


ROLES: dict[str, Role] = {
    "local": Role(Band(), "offsets -w..+w around i, i itself included (local_window)", main=1),
    "delimiter": Role(Keys((CLS_GROUP, SEP_GROUP)), "[CLS] (decoders: BOS) and every [SEP]", main=3),
    "delimiter_cls": Role(
        Keys((CLS_GROUP,)), "[CLS] (BOS) only", empty="corpus {corpus}: the model input has no [CLS]/BOS token"
    ),
    "delimiter_sep": Role(
        Keys((SEP_GROUP,)), "[SEP]s only", empty="corpus {corpus}: the model input has no [SEP] token ({model_kind})"
    ),
    "block": Role(
        Block(),
        "the content tokens of the query's own segment",
        empty="corpus {corpus} has no sentence pairs ([CLS] A [SEP] B [SEP]); block needs pairs",
        main=4,
    ),
    "syntactic": Role(Arcs(), "the pieces of the head word of each dependency pair, from the dependent's", main=2),
}


def check_registry(registry: dict[str, Role]) -> None:
    """A registry the reducer can compute: one :class:`Arcs` role, last; distinct main places."""
    arcs = [name for name, r in registry.items() if isinstance(r.sieve, Arcs)]
    if len(arcs) != 1 or list(registry)[-1] != arcs[0]:
        raise ValueError(f"Pande roles: one syntactic (Arcs) role, last in the registry; got {list(registry)}")
    mains = [r.main for r in registry.values() if r.main]
    if len(set(mains)) != len(mains):
        raise ValueError(f"Pande roles: two roles share a main place: {mains}")


def token_roles(registry: dict[str, Role] = ROLES) -> dict[str, Role]:
    """The roles scored per query token (every kind but :class:`Arcs`), in registry order."""
    return {name: r for name, r in registry.items() if not isinstance(r.sieve, Arcs)}


def arc_role(registry: dict[str, Role] = ROLES) -> str:
    """The name of the syntactic role (the prefix of its per-relation roles)."""
    check_registry(registry)
    return next(reversed(registry))


def role_names(relations, registry: dict[str, Role] = ROLES) -> list[str]:
    """The score columns: the token roles, the syntactic union, then one per relation."""
    arcs = arc_role(registry)
    return list(token_roles(registry)) + [arcs] + [f"{arcs}_{r}" for r in relations]


def main_roles(registry: dict[str, Role] = ROLES) -> list[str]:
    """The main roles in their place order (the figures' first roles, the atlas markers, the ablated roles)."""
    return sorted((name for name, r in registry.items() if r.main), key=lambda name: registry[name].main)


def figure_order(registry: dict[str, Role] = ROLES) -> list[str]:
    """The order of the figures: the main roles, then the other registry roles in registry order."""
    first = main_roles(registry)
    return first + [name for name in registry if name not in first]


def key_groups(registry: dict[str, Role] = ROLES) -> tuple[tuple[int, ...], ...]:
    """The special-kind groups of every :class:`Keys` role, each once, in registry order (for the default
    registry: ([CLS]/BOS, [SEP]), the groups the surface statistics ask for too)."""
    out: list[tuple[int, ...]] = []
    for r in registry.values():
        if isinstance(r.sieve, Keys):
            out += [tuple(g) for g in r.sieve.groups if tuple(g) not in out]
    return tuple(out)


TOKEN_ROLES = tuple(token_roles())
