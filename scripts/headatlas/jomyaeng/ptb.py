"""A reader for Penn-Treebank bracketed constituency trees (one tree per sentence).

Trees are separated by blank lines or simply follow one another; a tree may span many
lines. ``(ROOT (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat)) (. .)))`` becomes nested
:class:`Tree` nodes whose leaves are the words. PTB escapes ``-LRB-``/``-RRB-`` (and the
curly variants) in leaf position are turned back into brackets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..core.data import read_lines

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_UNESCAPE = {"-LRB-": "(", "-RRB-": ")", "-LCB-": "{", "-RCB-": "}", "-LSB-": "[", "-RSB-": "]"}


def _unescape(word: str) -> str:
    if "-" not in word:  # nearly every word: no escape to look for
        return word
    for esc, ch in _UNESCAPE.items():
        if esc in word:
            word = word.replace(esc, ch)
    return word


class TreeError(ValueError):
    """A malformed bracketed tree; the message names the file and line."""


@dataclass(frozen=True)
class Tree:
    label: str
    children: tuple["Tree | str", ...]

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def leaves(self) -> list[str]:
        out: list[str] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                out.append(node)
            else:
                stack.extend(reversed(node.children))
        return out

    def height(self) -> int:
        """Nodes on the longest path from this node down to a preterminal (POS) node,
        both included: ``(S (NP (DT the)))`` has height 3; a preterminal has height 1."""
        if self.is_preterminal:
            return 1
        return 1 + max(c.height() for c in self.children if isinstance(c, Tree))


def base_label(label: str) -> str:
    """The category without function tags or indices: ``NP-SBJ-1`` -> ``NP``, ``-LRB-`` kept."""
    if label.startswith("-") and label.endswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def strip_root(tree: Tree) -> Tree:
    """The sentence node: the only child of a ``ROOT`` (or empty-labelled) wrapper."""
    while tree.label in ("ROOT", "") and len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        tree = tree.children[0]
    return tree


def tree_depth(tree: Tree) -> int:
    """SentEval's TreeDepth: the longest path from the sentence node (below ROOT) to a word,
    counted in constituent nodes including the POS node."""
    return strip_root(tree).height()


def top_constituents(tree: Tree) -> str:
    """SentEval's TopConstituents: the categories right below the sentence node, joined by
    ``_`` (function tags stripped), e.g. ``NP_VP_.``."""
    top = strip_root(tree)
    if top.is_preterminal:
        return base_label(top.label)
    return "_".join(base_label(c.label) for c in top.children if isinstance(c, Tree))


def parse_trees(text: str, where: str = "<string>") -> list[Tree]:
    """All trees in ``text``; errors name ``where`` and the line."""
    trees: list[Tree] = []
    stack: list[tuple[str, list, int]] = []
    expect_label = False
    line_starts = [m.start() for m in re.finditer(r"^", text, flags=re.M)]

    def line_of(pos: int) -> int:
        lo, hi = 0, len(line_starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if line_starts[mid] <= pos:
                lo = mid
            else:
                hi = mid
        return lo + 1

    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "(":
            if expect_label:  # "((" : a node with an empty label
                stack.append(("", [], m.start()))
            expect_label = True
            continue
        if expect_label:
            if tok == ")":
                raise TreeError(f"{where}:{line_of(m.start())}: empty node '()'")
            stack.append((tok, [], m.start()))
            expect_label = False
            continue
        if tok == ")":
            if not stack:
                raise TreeError(f"{where}:{line_of(m.start())}: unbalanced ')'")
            label, children, start = stack.pop()
            if not children:
                raise TreeError(f"{where}:{line_of(start)}: node {label!r} has no children")
            node = Tree(label, tuple(children))
            if stack:
                stack[-1][1].append(node)
            else:
                trees.append(node)
            continue
        if not stack:
            raise TreeError(f"{where}:{line_of(m.start())}: word {tok!r} outside any tree")
        stack[-1][1].append(_unescape(tok))
    if stack or expect_label:
        pos = stack[-1][2] if stack else len(text)
        raise TreeError(f"{where}:{line_of(pos)}: tree not closed at end of input")
    return trees


def read_trees(path: str | Path) -> list[Tree]:
    """Trees of a (optionally gzipped) bracketed file."""
    return parse_trees("".join(read_lines(path)), where=str(path))
