"""What a newcomer's second hour broke (issue 43): damaged inputs, odd names and odd command lines give one clear
line or the right outcome, never a traceback; `look` writes under results/look/ without progress bars; `export
headvis` writes every model of a run."""

from __future__ import annotations

import json
import random
import shutil

import pandas as pd
import pytest

from headatlas.cli import main
from headatlas.core.data import Record
from headatlas.core.integrity import IntegrityError, check_file, check_name, check_unk_share, damaged, seal
from headatlas.core.models import ModelError
from integration.test_headvis import _validator, run_dir  # noqa: F401  (the fixture: a run's results/ with the atlas of m)

LONG_WORD = "".join(random.Random(0).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3000))


# --- a damaged seal -----------------------------------------------------------------------------------------


def test_a_seal_of_random_bytes_reads_as_a_missing_one(tmp_path, monkeypatch):
    """Random bytes in a .sha256 file (not text) made every snakemake command fail at parse time with a
    UnicodeDecodeError naming no file: the file now reads as unsealed, so its job reruns."""
    monkeypatch.chdir(tmp_path)
    table = tmp_path / "results" / "pande" / "m" / "table.tsv"
    table.parent.mkdir(parents=True)
    table.write_text("a\tb\n1\t2\n")
    side = seal(table)
    assert damaged("results") == []
    side.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(80)) + b"\xff\xfe")
    [(path, problem)] = damaged("results")
    assert path == table.relative_to(tmp_path) or path.resolve() == table
    assert "no checksum (table.tsv.sha256 unreadable" in problem and "rerun snakemake" in problem
    with pytest.raises(IntegrityError, match="unreadable"):
        check_file(table)


# --- overflow: truncate, one overlong record alone in a shard -----------------------------------------------


def test_one_overlong_record_alone_in_a_shard_is_skipped_as_in_a_larger_shard(tmp_path, tiny_loaded, ewt_records):
    """Under overflow: truncate, a record whose first word alone exceeds max_length is skipped and counted in
    any shard; the corpus fails only when none of its records fits."""
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.store import AttentionStore

    spec, model, tokenizer, config = tiny_loaded("bert")
    spec = spec.__class__(**{**spec.__dict__, "max_length": 16})
    long = Record(id="long", words=("x" + "qzj" * 30,), segment=(0,))  # 91 characters: dozens of word pieces
    short = [r for r in ewt_records if len(r.words) <= 8][:3]
    corpus = [*short, long]
    settings = ExtractSettings(overflow="truncate")
    meta = {"corpus": "c", "n_shards": 2}
    # the overlong record alone in the second shard: an empty store, the record counted as skipped
    counts = extract([long], spec, model, tokenizer, config, tmp_path / "s1", settings, 3,
                     {**meta, "shard": 1}, corpus_records=corpus)  # fmt: skip
    assert counts["skipped_too_long"] == 1 and counts["sequences"] == 0
    with AttentionStore(tmp_path / "s1") as st:
        assert len(st) == 0
    # in a larger shard: skipped and counted the same way
    counts = extract(corpus, spec, model, tokenizer, config, tmp_path / "all", settings, 0, {**meta, "shard": 0})
    assert counts["skipped_too_long"] == 1 and counts["sequences"] == 3
    # a corpus of overlong records only fails, in one shard or several, naming the cause
    for records, first in (([long], 0), ([long], 1)):
        with pytest.raises(ModelError, match="every record is longer than max_length 16 .not even the first word"):
            extract(records, spec, model, tokenizer, config, tmp_path / f"x{first}", settings, first,
                    corpus_records=[long, long])  # fmt: skip
        assert not (tmp_path / f"x{first}").exists()


def test_extract_shard_passes_the_corpus_to_a_shard_of_overlong_records(tmp_path, tiny_models, tiny_loaded):
    from headatlas.fused import extract_shard

    _, model, tokenizer, config = tiny_loaded("bert")
    long = Record(id="long", words=("x" + "qzj" * 30,), segment=(0,))
    records = [Record(id="a", words=("the", "cat"), segment=(0, 0)), long]
    params = {"model": {"name": "bert", "source": {"path": str(tiny_models["bert"])}, "max_length": 16},
              "storage_dtype": "float16", "overflow": "truncate", "maps": True, "reps": False, "rep_position": "last"}  # fmt: skip
    counts = extract_shard(records, params, "c", 1, 2, tmp_path / "s1", model, tokenizer, config)
    assert counts["skipped_too_long"] == 1 and counts["sequences"] == 0


# --- the [UNK] share check ----------------------------------------------------------------------------------


def test_unk_share_names_an_overlong_word_not_the_tokenizer(bert_tokenizer):
    records = [
        Record(id="r0", words=("the", LONG_WORD, "sat"), segment=(0, 0, 0)),
        Record(id="r1", words=("a", "dog"), segment=(0, 0)),
    ]
    with pytest.raises(IntegrityError) as e:
        check_unk_share(records, bert_tokenizer, "model 'bert' on c.jsonl.gz", 0.05)
    msg = str(e.value)
    assert "record 'r0', word 2 (3,000 characters" in msg and "tokenizer.json" not in msg
    assert "longer than the tokenizer's 100 characters per word" in msg and "\n" not in msg
    # a tokenizer that lost its vocabulary is still blamed: short words turned into [UNK]
    unknown = [Record(id="u", words=("\u2603", "\u2604", "\u2605", "cat"), segment=(0,) * 4)]
    with pytest.raises(IntegrityError, match="tokenizer.json"):
        check_unk_share(unknown, bert_tokenizer, "model 'bert'", 0.05)


# --- model names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["-x", "--help", "-"])
def test_a_model_name_starting_with_a_dash_is_refused(name):
    from headatlas.core.config_checks import check_config

    with pytest.raises(IntegrityError, match=r"config key models\[\]\.name: '-.*' starts with '-'"):
        check_config({"models": [{"name": name, "source": {"hub": "a/b"}}], "corpora": {}})
    assert check_name("x-1", "models[].name") == "x-1"


# --- headatlas look -----------------------------------------------------------------------------------------


def _look(tmp_path, model, sentence, *extra):
    return main(["look", str(model), sentence, "--config", "", "--results", str(tmp_path / "r"), *extra])


def test_look_writes_under_results_look_without_progress_bars(tmp_path, tiny_models, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _look(tmp_path, tiny_models["bert"], "the cat sat .") == 0
    out, err = capfd.readouterr()
    assert (tmp_path / "r" / "look" / "bert.png").is_file() and (tmp_path / "r" / "look" / "bert.svg").is_file()
    assert not list(tmp_path.glob("look_*")) and f"maps: {tmp_path / 'r' / 'look' / 'bert.png'}" in out
    assert "Loading weights" not in err and "it/s" not in err and "%|" not in err
    assert _look(tmp_path, tiny_models["bert"], "the cat", "--out", str(tmp_path / "new" / "dir" / "m.png")) == 0
    assert (tmp_path / "new" / "dir" / "m.png").is_file()


def test_look_a_first_word_longer_than_the_model_takes_is_one_line(tmp_path, tiny_models, capsys):
    """A 3,000-character word on a GPT-2-type model: no word prefix fits (it was an AttributeError)."""
    assert _look(tmp_path, tiny_models["gpt2"], LONG_WORD) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the first word alone (3,000 characters") and err.count("\n") == 1
    assert "Traceback" not in err


def test_look_an_argument_that_is_not_utf8_is_one_line(tmp_path, tiny_models, capsys):
    """A command line with bytes that are not UTF-8 (Python passes them as lone surrogates)."""
    arg = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")
    assert _look(tmp_path, tiny_models["bert"], arg) == 1
    err = capsys.readouterr().err
    assert err == "error: the sentence is not UTF-8 text (byte 0xe9 at character 4): give it in UTF-8 (check the " \
                  "terminal's encoding, or convert it with iconv)\n"  # fmt: skip
    assert _look(tmp_path, tiny_models["bert"], "ok", "--pair", arg) == 1
    assert "the second sentence (--pair) is not UTF-8" in capsys.readouterr().err


def test_look_cuts_a_long_input_at_the_models_position_limit(tmp_path, tiny_models, capsys):
    """The tiny models take 256 positions, fewer than look's default max_length 512 (it crashed at 512)."""
    assert _look(tmp_path, tiny_models["bert"], " ".join(["the cat sat ."] * 150)) == 0
    out, err = capsys.readouterr()
    assert "at most 256 tokens (its position limit, max_position_embeddings in config.json)" in err
    assert _look(tmp_path, tiny_models["gpt2"], " ".join(["the cat sat ."] * 150), "--max-length", "40") == 0
    assert "at most 40 tokens (max_length)" in capsys.readouterr().err  # a lower max_length still rules


# --- headatlas export headvis -------------------------------------------------------------------------------


def test_export_headvis_writes_every_model_of_a_run(run_dir, tmp_path, capsys):  # noqa: F811
    """A two-model run exports both (OUT/MODEL/data each) unless --model picks one (it needed --model)."""
    m2 = run_dir / "atlas" / "m2"
    shutil.copytree(run_dir / "atlas" / "m", m2)
    atlas = pd.read_csv(m2 / "atlas.tsv", sep="\t").assign(model="m2")
    atlas.to_csv(m2 / "atlas.tsv", sep="\t", index=False)
    out = tmp_path / "hv"
    assert main(["export", "headvis", str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    for model in ("m", "m2"):
        config = json.loads((out / model / "data" / "config.json").read_text())
        _validator("config").validate(config)
        assert config["model_name"] == model and f"HeadVis data: {out / model / 'data'} ({model}:" in printed
    assert not (out / "data").exists()
    one = tmp_path / "one"
    assert main(["export", "headvis", str(run_dir), str(one), "--model", "m2"]) == 0
    assert json.loads((one / "data" / "config.json").read_text())["model_name"] == "m2"
    assert sorted(p.name for p in one.iterdir()) == ["data"]
