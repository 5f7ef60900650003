"""The one registry of atlas columns: what every column of ``results/atlas/{model}/atlas.tsv`` holds and
in which unit. The atlas page, the atlas table of the report (column notes under the table) and the
``headatlas`` command all read it, so a column is described once.

- :data:`COLUMNS`: ordered :class:`Column` entries (a regular expression on the column name, the
  description and the unit, each with ``{0}``, ``{1}`` ... filled from the pattern's groups); the first
  entry that matches wins, so specific patterns come before general ones;
- :data:`FAMILIES`: column-name prefix -> the analysis family it belongs to (page groups, CLI sections);
- :func:`describe`: a column name -> :class:`ColumnDoc` (description, unit, family);
- :func:`value_kinds` / :func:`ci_columns`: the companion columns of a value column (its kind column,
  ``<column>_kind``, and its CI columns).

Adding a column of a new analysis: one :class:`Column` line in :data:`COLUMNS` (and, for a new prefix,
one line in :data:`FAMILIES`); a column without an entry is shown under its own name with no unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..detectors import registry as detectors

KIND_SUFFIX = "_kind"  # <value column>_kind: how the value was obtained (see KINDS)
# the kinds a value column's kind column may hold; "skipped: <reason>" carries its reason
KINDS = {
    "exact": "measured exactly",
    "estimated (checked)": "an estimate whose method was checked against exact values",
    "unreliable": "an estimate that failed its check: not an effect",
    "skipped": "not measured",
}
CI_SUFFIXES = ("_ci_low", "_ci_high")


@dataclass(frozen=True)
class Column:
    pattern: str  # regular expression, matched against the whole column name
    desc: str  # what the column holds; {0}, {1}... are the pattern's groups
    unit: str = ""  # unit of the value ("" for labels, flags and dimensionless coordinates)


@dataclass(frozen=True)
class ColumnDoc:
    name: str
    desc: str
    unit: str
    family: str
    known: bool  # False: no registry entry matched (desc is the name itself)

    def text(self) -> str:
        """Description with its unit, as one phrase: ``desc (unit)``."""
        return f"{self.desc} ({self.unit})" if self.unit else self.desc


FAMILIES = {
    "clark": "Clark et al. (surface)",
    "pande": "Pande et al. (heads hypothesis)",
    "syntax": "Clark et al. (syntax)",
    "coref": "Clark et al. (coreference)",
    "probe": "Jo & Myaeng (probing)",
    "det": "detectors",
    "ablation": "ablation",
    "icl": "ICL (function vectors)",
    "circ": "circuits",
    "quiet": "quiet heads (positional, dormant, rigid; massive activations)",
}

FRACTION = "fraction of the row's attention, 0-1"
COLUMNS: tuple[Column, ...] = (
    # Clark et al. surface statistics (clark/surface.py; corpus analysis.atlas.surface_corpus)
    Column(r"clark_behaviour", "Clark's behaviour label (broad, next, prev, cls/bos, sep, punct or other)", "label"),
    Column(r"clark_(next|prev|self)", "mean attention to the {0} token", FRACTION),
    Column(r"clark_cls", "mean attention to [CLS] (BOS for decoders)", FRACTION),
    Column(r"clark_sep", "mean attention to [SEP] tokens", FRACTION),
    Column(r"clark_punct", 'mean attention to ". ,"', FRACTION),
    Column(r"clark_entropy", "mean smoothed row entropy of the attention", "nats"),
    Column(r"clark_cls_entropy", "entropy of the [CLS] row (decoders: the last token's)", "nats"),
    Column(r"clark_mds_([xy])", "{0} coordinate of the 2-D MDS of Jensen-Shannon head distances", "MDS units"),
    # Pande et al. (pande/hypothesis.py)
    Column(r"pande_(.+)_effect_ci_(low|high)", "{1} end of the 95% CI of the {0} sieve effect", "ratio to tau"),
    Column(
        r"pande_(.+)_effect",
        "Pande sieve effect of role {0}: mean sentence score / tau (tau = 3; > 1 holds the role)",
        "ratio to tau",
    ),
    Column(r"pande_(.+)_sig_faithful", "role {0} significant: one-sided t-test against tau, alpha 0.05, uncorrected"),
    Column(r"pande_(.+)_sig_fdr", "role {0} significant after Benjamini-Hochberg FDR over all heads x roles"),
    Column(
        r"pande_(.+)_stability_(faithful|fdr)",
        "share of bootstrap resamples in which role {0} holds ({1})",
        "share, 0-1",
    ),
    Column(
        r"pande_(.+)_corpus_share_(faithful|fdr)",
        "share of the tested corpora whose own test gives role {0} ({1})",
        "share, 0-1",
    ),  # fmt: skip
    # Clark et al. syntax and coreference (clark/syntax.py, clark/coref.py)
    Column(
        r"syntax_best_relation",
        "the UD relation the head's argmax predicts best relative to its offset baseline",
        "label",
    ),
    Column(r"syntax_best_direction", "direction of that relation (dep->head or head->dep)", "label"),
    Column(r"syntax_best_accuracy", "argmax accuracy on the best relation", "fraction of dependents, 0-1"),
    Column(
        r"syntax_best_margin",
        "accuracy on the best relation minus its best fixed-offset baseline",
        "difference of fractions",
    ),  # fmt: skip
    Column(
        r"syntax_all_accuracy", "argmax accuracy over all dependents, better direction", "fraction of dependents, 0-1"
    ),
    Column(r"syntax_all_margin", "accuracy over all dependents minus the best fixed offset", "difference of fractions"),
    Column(r"coref_accuracy", "coreference antecedent selection accuracy, all anaphors", "fraction of anaphors, 0-1"),
    Column(r"coref_(.+)_accuracy", "coreference antecedent accuracy for {0} anaphors", "fraction of anaphors, 0-1"),
    # Jo & Myaeng (jomyaeng/analysis.py): a relatedness task (SICK-R) is scored by Pearson r, its column _r
    Column(
        r"probe_(surface|syntactic|semantic)_mean_acc",
        "Jo & Myaeng mean probing accuracy over the {0} tasks",
        "fraction of test items, 0-1",
    ),  # fmt: skip
    Column(r"probe_(.+)_acc", "Jo & Myaeng per-head probe test accuracy on {0}", "fraction of test items, 0-1"),
    Column(
        r"probe_(.+)_r",
        "Jo & Myaeng per-head probe on the relatedness task {0}: Pearson r between predicted and gold scores",
        "Pearson r, -1 to 1",
    ),
    Column(r"probe_(.+)_selectivity", "probe accuracy on {0} minus control-task accuracy", "difference of fractions"),
    # detectors (detectors/reducers.py, detectors/analysis.py), on each detector's main input kind
    # det_<name>: each detector's own description, from its registry entry (describe)
    Column(r"det_(.+)_ci_(low|high)", "{1} end of the bootstrap CI of the {0} score", FRACTION),
    Column(
        r"det_(.+)_sig", "{0} score above its shuffled-position null: one-sided t-test, Benjamini-Hochberg FDR"
    ),  # fmt: skip
    Column(r"det_sink_head", "sink head: mean attention to the first token above the sink epsilon (default 0.3)"),
    Column(
        r"det_kv_group",
        "key/value head the query head reads (grouped-query attention; an encoder has one per head)",
        "index",
    ),
    # ablation (ablation/analysis.py): effect = ablated - intact, mean over the task's sequences
    Column(
        r"ablation_(.+)_loss(?:_effect)?",
        "ablation effect on task {0}: loss with the head ablated minus intact (> 0: the head helps)",
        "nats per token",
    ),
    Column(
        r"ablation_(.+)_accuracy(?:_effect)?",
        "ablation effect on task {0}: accuracy with the head ablated minus intact (< 0: the head helps)",
        "difference of fractions",
    ),
    Column(r"ablation_(.+)_ci_(low|high)", "{1} end of the bootstrap CI of the {0} ablation effect", "as the effect"),
    Column(
        r"ablation_(.+)_method", "how the {0} effect was measured: exact, atp, ig, none or skipped: <reason>", "label"
    ),
    # function-vector heads (icl/analysis.py, docs/icl.md): patched at the last position of label-shuffled prompts
    Column(r"icl_aie", "function-vector AIE: p(target), head's task mean patched in, minus corrupted", "probability"),
    Column(r"icl_null_quantile", "share of null AIEs (another head's mean patched in) below this AIE", "0-1"),
    Column(r"icl_above_null", "the AIE's CI lies above the null's 95% quantile"),
    Column(r"icl_top", "among the top-k heads by AIE (function-vector heads)"),
    # circuits (circuits/analysis.py): composition from the weights, copying, successor, long inputs
    Column(
        r"circ_(q|k|v)_in_z",
        "largest {0}-composition with an earlier head writing into this one, z against random orientations",
        "z (sd units)",
    ),
    Column(r"circ_(q|k|v)_in_from", "the earlier head of that largest {0}-composition (layer-head)", "label"),
    Column(
        r"circ_(q|k|v)_out_z",
        "largest {0}-composition with a later head reading this one, z against random orientations",
        "z (sd units)",
    ),
    Column(r"circ_(q|k|v)_out_to", "the later head of that largest {0}-composition (layer-head)", "label"),
    Column(
        r"circ_copying",
        "copying: share of the listed tokens whose own logit is in the top 5 of the head's OV circuit",
        "fraction of tokens, 0-1",
    ),
    Column(
        r"circ_neg_copying",
        "copy suppression: share of the listed tokens whose own logit is in the bottom 5 of the head's OV circuit",
        "fraction of tokens, 0-1",
    ),
    Column(
        r"circ_successor",
        "successor score (Gould et al.): share of ordinal tokens whose successor ranks first through the OV circuit",
        "fraction of tokens, 0-1",
    ),
    Column(
        r"circ_retrieval",
        "retrieval score (Wu et al.): share of needle tokens the head copies while the model answers",
        "fraction of needle tokens, 0-1",
    ),
    Column(r"circ_retrieval_positive", "retrieval score's CI lies above 0"),
    Column(r"circ_retrieval_runs", "needle runs the model answered (ROUGE-1 recall > 0.5)", "count"),
    Column(r"circ_echo_long(?:_(\d+))?", "long-range echo: attention to the earlier occurrence of the token", FRACTION),
    Column(
        r"circ_induction_long(?:_(\d+))?",
        "long-range induction: attention to the token after the earlier occurrence",
        FRACTION,
    ),
    Column(r"circ_echo_top1", "among RazorAttention's top 1% echo heads"),
    Column(r"circ_induction_top14", "among RazorAttention's top 14% long-range induction heads"),
    Column(
        r"circ_induction_drop",
        "induction heads: drop of the induction score when the top previous-token heads are mean-ablated",
        "difference of attention fractions",
    ),
    Column(r"circ_prev_ablated", "one of the previous-token heads ablated in the induction check"),
    Column(r"circ_(.+)_sig", "{0} above chance: binomial test, Benjamini-Hochberg FDR"),
    Column(r"circ_note", "what was skipped for this model, and why", "label"),
    # quiet heads (quiet/analysis.py; docs/quiet_heads.md), natural text, means over sequences with bootstrap CIs
    Column(
        r"quiet_prev",
        "share of rows whose unique largest weight is on the previous token (Voita et al.)",
        "share of rows, 0-1",
    ),
    Column(
        r"quiet_next", "share of rows whose unique largest weight is on the next token (encoders)", "share of rows, 0-1"
    ),
    Column(r"quiet_positional", "positional share: the larger of quiet_prev and quiet_next", "share of rows, 0-1"),
    Column(r"quiet_positional_offset", "the offset of that share (-1 previous, +1 next token)", "tokens"),
    Column(
        r"quiet_positional_head", "positional head: positional share at least analysis.quiet.positional_share (0.9)"
    ),
    Column(r"quiet_max_weight", "mean largest weight of a row", FRACTION),
    Column(r"quiet_entropy", "mean row entropy of the attention (unsmoothed)", "nats"),
    Column(r"quiet_entropy_var", "variance over sequences of the head's mean row entropy (0: rigid)", "nats squared"),
    Column(
        r"quiet_norm", "mean L2 norm of the head's output per token, before the output projection", "activation units"
    ),
    Column(r"quiet_norm_rel", "output norm over the mean output norm of the heads of its layer", "ratio"),
    Column(
        r"quiet_massive_first",
        "share of sequences whose residual stream entering this layer has a massive activation at the first token",
        "share of sequences, 0-1",
    ),
    Column(
        r"quiet_sink_after_massive",
        "sink head (det_sink_head) whose layer input holds a massive activation at the first token (NA: no sink head)",
    ),
    Column(r"quiet_zero_effect", "next-token loss with the head's output set to zero, minus intact", "nats"),
    Column(r"quiet_zero_null", "the zero-ablation's loss effect has a CI that holds 0 (dormant by zero-ablation)"),
    Column(
        r"(.+)_kind", "how {0} was obtained: exact, estimated (checked), unreliable or skipped: <reason>", "label"
    ),  # fmt: skip
    Column(r"(.+)_ci_(low|high)", "{1} end of the CI of {0}", "as {0}"),
)


def family(name: str) -> str:
    """The analysis family of a column (by its prefix), e.g. ``detectors`` for ``det_prev``."""
    p = name.split("_")[0]
    return FAMILIES.get(p, "other: " + p)


def describe(name: str) -> ColumnDoc:
    """What an atlas column holds, its unit and family (the name itself and no unit when unknown)."""
    det = detectors.REGISTRY.get(name.removeprefix("det_")) if name.startswith("det_") else None
    if det is not None:
        return ColumnDoc(name, det.describe, FRACTION, family(name), True)
    for col in COLUMNS:
        m = re.fullmatch(col.pattern, name)
        if m:
            g = m.groups()
            return ColumnDoc(name, col.desc.format(*g), col.unit.format(*g), family(name), True)
    return ColumnDoc(name, name, "", family(name), False)


def ci_columns(name: str, columns) -> tuple[str, str] | None:
    """The (low, high) CI columns of ``name`` among ``columns``: ``<name>_ci_low/high``, or for an
    ``..._effect`` column ``..._ci_low/high`` (the ablation's naming); None when there are none."""
    cols = set(columns)
    bases = [name] + ([name[: -len("_effect")]] if name.endswith("_effect") else [])
    for base in bases:
        pair = (base + CI_SUFFIXES[0], base + CI_SUFFIXES[1])
        if pair[0] != name and all(c in cols for c in pair):
            return pair
    return None


def kind_column(name: str, columns) -> str | None:
    """The column that says how the values of ``name`` were obtained (``<name>_kind``), if any."""
    k = name + KIND_SUFFIX
    return k if k in set(columns) else None


def kind_class(kind: str | None) -> str:
    """A kind value as one of exact, estimated, unreliable, skipped ('' for a missing kind: drawn plain)."""
    if kind is None or kind == "":
        return ""
    k = str(kind).strip()
    if k.startswith("skipped"):
        return "skipped"
    if k.startswith("estimated"):
        return "estimated"
    return k if k in ("exact", "unreliable") else ""


def is_effect(kind: str | None) -> bool:
    """Whether a value of this kind may be read (and coloured) as an effect: not unreliable, not skipped."""
    return kind_class(kind) not in ("unreliable", "skipped")
