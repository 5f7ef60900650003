"""core.io.write_tsv: the one TSV writer of the rule scripts (exact bytes, atomic, sealed)."""

import numpy as np
import pandas as pd
import pytest

from headatlas.core.io import write_tsv


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
    for script in sorted((REPO / "scripts").glob("*.py")):
        text = script.read_text()
        found += [f"{script.name}: {s}" for s in ("sys.path", "# noqa", ".to_csv(") if s in text]
    assert not found, found
