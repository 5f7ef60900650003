"""core.io.write_tsv: the one TSV writer of the rule scripts (exact bytes, atomic, sealed); the readers of a
table's shape (head_shape, layer_count) and of its boolean columns (flags)."""

import numpy as np
import pandas as pd
import pytest

from headatlas.core.io import flags, head_shape, layer_count, write_tsv


def test_write_tsv_bytes_and_seal(tmp_path):
    t = pd.DataFrame({"layer": [0, 1], "score": [1 / 3, np.nan], "role": ["a", "b"]})
    path = tmp_path / "sub" / "t.tsv"
    write_tsv(t, path)
    assert path.read_text() == "layer\tscore\trole\n0\t0.333333\ta\n1\t\tb\n"
    assert (tmp_path / "sub" / "t.tsv.sha256").exists()
    write_tsv(t, path, float_format="%.2f", na_rep="NA")
    assert path.read_text() == "layer\tscore\trole\n0\t0.33\ta\n1\tNA\tb\n"
    write_tsv(t, path, float_format=None)
    assert path.read_text().splitlines()[1] == "0\t0.3333333333333333\ta"


def test_write_tsv_leaves_nothing_on_failure(tmp_path):
    class Broken(pd.DataFrame):
        def to_csv(self, path, **kw):
            open(path, "w").write("half")
            raise OSError("disk full")

    with pytest.raises(OSError):
        write_tsv(Broken({"a": [1]}), tmp_path / "t.tsv")
    assert list(tmp_path.iterdir()) == []


def test_rule_scripts_have_no_path_lines_noqa_or_own_tsv_writer():
    """Every rule script imports the library directly (the Snakefile's PYTHONPATH is the one route) and writes
    its TSVs with write_tsv."""
    from conftest import REPO

    found = []
    for script in sorted((REPO / "workflow" / "scripts").glob("*.py")):
        text = script.read_text()
        found += [f"{script.name}: {s}" for s in ("sys.path", "# noqa", ".to_csv(") if s in text]
    assert not found, found


def test_flags_read_booleans_as_a_tsv_gives_them_back():
    mixed = pd.Series([True, False, "True", "False", np.True_, 1, 1.0, 0, "true", "1", "x", np.nan, None, pd.NA])
    want = [True, False, True, False, True, True, True, False, False, False, False, False, False, False]
    got = flags(mixed)
    assert got.dtype == bool and got.tolist() == want
    assert flags(mixed, na=True).tolist() == want[:-3] + [True] * 3
    kept = flags(mixed, na=None)
    assert kept.dtype == "boolean" and kept.isna().tolist() == [False] * 11 + [True] * 3
    assert kept[:11].tolist() == want[:11]
    assert flags(pd.Series([True, False])).tolist() == [True, False]  # a bool column
    assert flags(pd.array([True, None], dtype="boolean")).tolist() == [True, False]
    assert flags(pd.Series([1.0, np.nan, 0.0])).tolist() == [True, False, False]  # a float column with gaps
    assert flags(["True", "False"]).tolist() == [True, False] and flags([]).tolist() == []
    # one value, as a row's cell
    assert flags("True") is True and flags(None) is False and flags(np.nan, na=None) is pd.NA


def test_flags_of_a_tsv_round_trip(tmp_path):
    t = pd.DataFrame({"a": [True, False, True], "b": pd.array([True, None, False], dtype="boolean")})
    write_tsv(t, tmp_path / "t.tsv")
    back = pd.read_csv(tmp_path / "t.tsv", sep="\t")
    assert flags(back["a"]).tolist() == [True, False, True]
    assert flags(back["b"]).tolist() == [True, False, False]
    assert flags(back["b"], na=None).tolist() == [True, pd.NA, False]


def test_head_shape_and_layer_count():
    heads = pd.DataFrame({"layer": [0, 0, 2, 2], "head": [0, 4, 0, 4]})
    assert head_shape(heads) == (3, 5) and layer_count(heads) == 3
    assert layer_count(pd.DataFrame({"layer": [1, 0], "role": ["a", "b"]})) == 2  # a per-layer table
