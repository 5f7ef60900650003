"""Every input error names its file and line: trees, encodings, TSV headers, config YAML,
max_length against the model's positions, tau; and the tiny fixtures' tokenizers really tokenize."""

from __future__ import annotations

import collections
import gzip
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO, RESOURCES, first_conllu_sentences, output_of, run_snakemake

from headatlas.core.corpora import CorpusError, build_corpus, read_conllu, tree_problem, tsv_records, wikitext_articles
from headatlas.core.data import load_records
from headatlas.core.inputs import ConfigError, check_yaml
from headatlas.core.models import ModelError, ModelSpec, check_max_length, position_limit
from headatlas.jomyaeng.probing_tasks import GeneratorError, Source, load_sources
from headatlas.jomyaeng.ptb import read_trees

EWT_TEST = RESOURCES / "ud_english_ewt" / "en_ewt-ud-test.conllu"
SCHEMAS = REPO / "workflow" / "schemas"


def tok(i, form, head, deprel="dep") -> str:
    return "\t".join(map(str, (i, form, form.lower(), "X", "X", "_", head, deprel, "_", "_")))


def conllu(tmp_path, lines: list[str], name: str = "t.conllu") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- trees ------------------------------------------------------------------------------------

GOOD = ["# sent_id = good", tok(1, "Fine", 0, "root"), tok(2, ".", 1, "punct"), ""]  # lines 1-4


@pytest.mark.parametrize(
    "words, line, what",
    [
        # (heads of words 1..3, line of the offending word, message); the bad sentence starts on line 6
        ([0, 1, 9], 8, "word 3 has HEAD 9 outside 0..3"),
        ([0, 2, 1], 7, "word 2 is its own head"),
        ([2, 3, 1], 6, "no root (no word has HEAD 0)"),
        ([0, 1, 0], 8, "2 roots (words 1, 3 have HEAD 0); a tree has exactly one"),
        ([0, 3, 2], 7, "cycle 2 -> 3 -> 2 (words 2, 3 do not reach the root)"),
    ],
)
def test_each_tree_defect_names_file_line_and_sentence(tmp_path, words, line, what):
    bad = ["# sent_id = bad", *(tok(i + 1, w, h) for i, (w, h) in enumerate(zip("abc", words))), ""]
    path = conllu(tmp_path, GOOD + bad)
    with pytest.raises(CorpusError) as err:
        read_conllu(path)
    assert str(err.value) == f"{path}:{line}: sentence 'bad' is not a tree: {what}"
    # skipped and counted with the option; the good sentence stays
    skipped: list[str] = []
    assert [s.sent_id for s in read_conllu(path, "skip", skipped)] == ["good"]
    assert skipped == [str(err.value)]


def test_cycle_hanging_below_names_the_cycle():
    # 1 is the root; 2 -> 3 -> 4 -> 2 is a cycle and 5 hangs below it
    assert tree_problem([0, 4, 2, 3, 3]) == (1, "cycle 2 -> 4 -> 3 -> 2 (words 2, 3, 4, 5 do not reach the root)")
    assert tree_problem([0, 1, 2, 3, 4, 5, 6, 7]) is None  # a chain: 7 steps up, pointer jumping reaches the root
    assert tree_problem([2, 0]) is None and tree_problem([0]) is None


def test_sentence_without_id_and_last_sentence_without_blank_line(tmp_path):
    path = conllu(tmp_path, GOOD + [tok(1, "a", 1)])  # line 5, no sent_id, no closing blank line
    with pytest.raises(
        CorpusError, match=re.escape(f"{path}:5: sentence 't.conllu:5' is not a tree: word 1 is its own head")
    ):
        read_conllu(path)


def test_build_corpus_invalid_trees_option(tmp_path):
    lines = GOOD + ["# newdoc id = d", "# sent_id = loop", tok(1, "x", 1), ""]
    path = conllu(tmp_path, lines)
    for kind in ("conllu", "conllu_documents"):
        with pytest.raises(CorpusError, match=re.escape(f"{path}:7: sentence 'loop'")):
            build_corpus({"kind": kind, "path": str(path)}, "c")
        skipped: list[str] = []
        recs = build_corpus({"kind": kind, "path": str(path), "invalid_trees": "skip"}, "c", skipped)
        assert [r.words for r in recs] == [("Fine", ".")] and len(skipped) == 1
    with pytest.raises(ValueError, match="invalid_trees"):
        read_conllu(path, "ignore")


def test_bundled_treebanks_are_valid_trees():
    for path in sorted(RESOURCES.glob("*/*.conllu")):
        skipped: list[str] = []
        assert read_conllu(path, "skip", skipped) and skipped == [], path


def test_jomyaeng_sources_reject_a_rootless_sentence(tmp_path):
    path = conllu(tmp_path, GOOD + ["# sent_id = rootless", tok(1, "a", 2), tok(2, "b", 1), ""])
    with pytest.raises(CorpusError, match=re.escape(f"{path}:6: sentence 'rootless' is not a tree: no root")):
        load_sources({"tb": {"train": str(path)}})
    # a Source built some other way: a clear error, not tuple.index's
    s = Source(id="tb-train-00001", split="train", words=("a", "b"), head=(1, 0), sent_id="rootless")
    with pytest.raises(GeneratorError, match=re.escape("source sentence 'rootless' (tb-train-00001) has 0 roots")):
        _ = s.root


# --- encodings --------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("kind", ["conllu", "tsv", "wikitext", "records", "ptb"])
def test_non_utf8_byte_names_file_line_and_column(tmp_path, kind, gz):
    good = {
        "conllu": "\n".join(GOOD) + "\n",
        "tsv": "a good film\t1\nbad\t0\n" * 300,  # the bad byte is far past the first read buffer
        "wikitext": " = T = \n one two \n three four \n" * 300,
        "records": '{"id": "a", "words": ["x"], "segment": [0]}\n',
        "ptb": "(ROOT (S (NP (DT a)) (VP (VBZ is))))\n",
    }[kind]
    data = good.encode() + "caf".encode() + b"\xe9 x\t0\n"  # latin-1 'é' on the last line, column 4
    line = good.count("\n") + 1
    path = tmp_path / (f"f.{kind}" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    read = {
        "conllu": lambda: read_conllu(path),
        "tsv": lambda: tsv_records(path, 1, 1),
        "wikitext": lambda: wikitext_articles(path),
        "records": lambda: load_records(path),
        "ptb": lambda: read_trees(path),
    }[kind]
    with pytest.raises(CorpusError) as err:
        read()
    assert str(err.value) == f"{path}:{line}: not UTF-8 (byte 0xe9 at column 4)"


# --- TSV headers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, text_columns, label_column, why",
    [
        ("sentence\tlabel\nit is good\t1\nbad\t0\nfine\t1\n", 1, 1, "its text columns are named ['sentence']"),
        ("sentence_A\tsentence_B\tscore\na b\tc d\t3.6\ne\tf\t1.0\n", 2, 2, "its text columns are named"),
        (
            "first text\tsecond text\trelatedness\na b\tc d\t3.6\ne\tf\t1.0\n",
            2,
            2,
            "its label 'relatedness' is not a number",
        ),
        ("review\tclass\ngood film\tPOS\nbad\tNEG\nok\tPOS\nmeh\tNEG\n", 1, 1, "its label 'class' occurs nowhere else"),
        ("text\nhello world\nbye\n", 1, None, "its text columns are named ['text']"),
    ],
)
def test_tsv_header_is_detected(tmp_path, text, text_columns, label_column, why):
    path = tmp_path / "h.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        tsv_records(path, text_columns, label_column)
    assert str(err.value).startswith(f"{path}:1: this line looks like a column header ({why}")
    assert "header: true" in str(err.value)
    skipped = tsv_records(path, text_columns, label_column, header=True)
    kept = tsv_records(path, text_columns, label_column, header=False)
    assert len(kept) == len(skipped) + 1 == text.count("\n")
    assert [r.id for r in skipped] == [r.id for r in kept[1:]]  # ids keep their line numbers
    spec = {"kind": "tsv", "path": str(path), "text_columns": text_columns, "header": True}
    if label_column is not None:
        spec["label_column"] = label_column
    assert [r.words for r in build_corpus(spec, "h")] == [r.words for r in skipped]


@pytest.mark.parametrize(
    "text, label_column",
    [
        ("a good film\t1\nbad\t0\nfine\t1\n", 1),  # the first label repeats
        ("a b\tc d\t3.6\ne\tf\t1.0\n", 2),  # numbers
        ("good film\tPOS\nbad\tNEG\nok\tNEU\n", 1),  # every label once: no sign of a header
        ("hello\t1\n", 1),  # one row: nothing to compare with
    ],
)
def test_tsv_without_header_is_not_flagged(tmp_path, text, label_column):
    path = tmp_path / "n.tsv"
    path.write_text(text, encoding="utf-8")
    assert len(tsv_records(path, label_column, label_column)) == text.count("\n")


# --- config files -----------------------------------------------------------------------------


def test_check_yaml_names_line_of_syntax_errors_and_duplicate_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - name: a\ncorpora:\n  ewt: {kind: conllu, path: x\n  wiki: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:5:7: YAML syntax error")):
        check_yaml(path)
    path.write_text("models:\n  - name: a\n\tsource: x\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:3:1: YAML syntax error")):
        check_yaml(path)
    path.write_text("corpora:\n  ewt: {kind: conllu}\n  sick: {}\n  ewt: {kind: tsv}\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=re.escape(f"{path}:4: key 'ewt' given twice in one mapping (first on line 2)")
    ):
        check_yaml(path)
    path.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:1: a config file is a mapping")):
        check_yaml(path)
    path.write_bytes(b"models: []\ncorpora: {caf\xe9: 1}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2: not UTF-8 (byte 0xe9 at column 14)")):
        check_yaml(path)
    path.write_text("base: &b {x: 1}\nother:\n  <<: *b\n  x: 2\n", encoding="utf-8")  # a merge key overridden: fine
    assert check_yaml(path) == {"base": {"x": 1}, "other": {"x": 2}}
    path.write_text('{"models":\t[], "corpora": {}}', encoding="utf-8")  # JSON, as Snakemake reads it
    assert check_yaml(path) == {"models": [], "corpora": {}}
    assert check_yaml(REPO / "config" / "config.yaml")["models"]
    assert check_yaml(REPO / "config" / "paper.yaml")["models"]


def snakemake_dry_run(workdir: Path, *args: str) -> tuple[int, str]:
    """(exit status, output) of a dry run that may fail."""
    proc = run_snakemake(workdir, None, "--dry-run", *args, cores=1, timeout=600, env={"HF_HUB_OFFLINE": "1"})
    return proc.returncode, output_of(proc)


def minimal_config(tmp_path, **model) -> dict:
    (tmp_path / "x.conllu").write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    stub = tmp_path / "stub-model"  # never loaded; its directory is checked when the workflow is parsed
    stub.mkdir(exist_ok=True)
    (stub / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    entry = {"name": "m", "source": {"path": str(stub)}, **model}
    return {"models": [entry], "corpora": {"x": {"kind": "conllu", "path": str(tmp_path / "x.conllu")}}}


@pytest.mark.slow
def test_workflow_config_yaml_errors_name_the_line(tmp_path):
    """What Snakemake allows: a --configfile with a syntax error stops Snakemake before the
    Snakefile runs, with a message that names no line (--verbose shows the parser's line);
    duplicate keys in it, and any error in the default config/config.yaml, name file:line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: a\ncorpora:\n  ewt: {kind: conllu, path: x\n  wiki: {}\n", encoding="utf-8")
    rc, out = snakemake_dry_run(tmp_path, "--configfile", str(bad))
    assert rc != 0 and "not valid JSON or YAML" in out
    rc, out = snakemake_dry_run(tmp_path, "--configfile", str(bad), "--verbose")
    assert rc != 0 and f'in "{bad}", line 5, column 7' in out
    dup = tmp_path / "dup.yaml"
    text = yaml.safe_dump(minimal_config(tmp_path), sort_keys=False)
    dup.write_text(text + "models: []\n", encoding="utf-8")
    rc, out = snakemake_dry_run(tmp_path, "--configfile", str(dup))
    line = text.count("\n") + 1
    assert rc != 0 and f"{dup}:{line}: key 'models' given twice in one mapping (first on line 1)" in out, out[-3000:]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("models: [\n  {name: a}\ncorpora: {}\n", encoding="utf-8")
    rc, out = snakemake_dry_run(tmp_path)
    assert rc != 0 and re.search(r"config/config\.yaml:3:\d+: YAML syntax error", out), out[-3000:]


# --- max_length against the position limit ----------------------------------------------------


def test_position_limit_keys():
    assert position_limit({"model_type": "bert", "max_position_embeddings": 512}) == ("max_position_embeddings", 512)
    assert position_limit({"model_type": "gpt2", "n_positions": 1024}) == ("n_positions", 1024)
    assert position_limit({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == (
        "max_position_embeddings",
        512,
    )
    assert position_limit({"model_type": "t5"}) is None


def test_check_max_length_names_both_numbers_and_the_key():
    bert = {"model_type": "bert", "max_position_embeddings": 256}
    check_max_length(ModelSpec(name="b", source={}, max_length=256), bert, "b/config.json")
    with pytest.raises(ModelError) as err:
        check_max_length(ModelSpec(name="b", source={}, max_length=300), bert, "b/config.json")
    assert (
        "model 'b': max_length 300 is above the model's position limit 256 (b/config.json: max_position_embeddings 256)"
        in str(err.value)
    )
    assert "models[b].max_length" in str(err.value)
    gpt2 = {"model_type": "gpt2", "n_positions": 256}
    spec = ModelSpec(name="g", source={}, max_length=256)
    check_max_length(spec, gpt2, "g/config.json")
    with pytest.raises(
        ModelError, match=r"max_length 256 \(\+1 token .*past_last\) is above the model's position limit 256"
    ):
        check_max_length(spec, gpt2, "g/config.json", past_last=True)
    check_max_length(
        ModelSpec(name="b", source={}, max_length=256), bert, "b/config.json", past_last=True
    )  # encoders read [CLS]


@pytest.mark.slow
def test_max_length_above_positions_fails_at_parse_time(tmp_path, tiny_models):
    cfg = minimal_config(tmp_path)
    cfg["models"] = [{"name": "bert", "source": {"path": str(tiny_models["bert"])}, "max_length": 300}]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    rc, out = snakemake_dry_run(tmp_path, "--configfile", str(tmp_path / "config.yaml"))
    assert rc != 0
    assert (
        f"max_length 300 is above the model's position limit 256 ({tiny_models['bert']}/config.json: max_position_embeddings 256)"
        in out
    ), out[-3000:]
    cfg["models"][0]["max_length"] = 256
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    rc, out = snakemake_dry_run(tmp_path, "--configfile", str(tmp_path / "config.yaml"))
    assert rc == 0, out[-3000:]


# --- schemas ----------------------------------------------------------------------------------


def validate(section: dict, schema: str) -> None:
    from snakemake.utils import validate as sm_validate

    sm_validate(section, str(SCHEMAS / schema))


@pytest.mark.parametrize("tau, ok", [(3, True), (0.5, True), (0, False), (-1, False)])
def test_pande_schema_rejects_tau_not_above_zero(tau, ok):
    if ok:
        validate({"tau": tau}, "pande.schema.yaml")
    else:
        with pytest.raises(Exception, match="tau"):
            validate({"tau": tau}, "pande.schema.yaml")


@pytest.mark.parametrize(
    "corpus, ok",
    [
        ({"kind": "conllu", "path": "x", "invalid_trees": "skip"}, True),
        ({"kind": "conllu_documents", "path": "x", "invalid_trees": "error"}, True),
        ({"kind": "conllu", "path": "x", "invalid_trees": "drop"}, False),
        ({"kind": "tsv", "path": "x", "text_columns": 1, "invalid_trees": "skip"}, False),
        ({"kind": "tsv", "path": "x", "text_columns": 1, "header": True}, True),
        ({"kind": "tsv", "path": "x", "text_columns": 1, "header": "auto"}, True),
        ({"kind": "conllu", "path": "x", "header": True}, False),
    ],
)
def test_corpus_schema_options(corpus, ok):
    cfg = {"models": [{"name": "m", "source": {"path": "d"}}], "corpora": {"c": corpus}}
    if ok:
        validate(cfg, "config.schema.yaml")
    else:
        with pytest.raises(Exception, match="header|additional"):
            validate(cfg, "config.schema.yaml")


@pytest.mark.slow
def test_prepare_corpus_skips_and_counts_invalid_trees(tmp_path):
    cfg = minimal_config(tmp_path)
    path = conllu(tmp_path, GOOD + ["# sent_id = loop", tok(1, "x", 1), ""], "loop.conllu")
    cfg["corpora"] = {"x": {"kind": "conllu", "path": str(path), "invalid_trees": "skip"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    config = str(tmp_path / "config.yaml")
    proc = run_snakemake(tmp_path, None, "results/corpora/x.jsonl.gz", "--configfile", config, cores=1, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r.id for r in load_records(tmp_path / "results/corpora/x.jsonl.gz")] == ["good"]
    log = (tmp_path / "logs/prepare_corpus/x.log").read_text()
    assert f"skipped (invalid_trees: skip): {path}:6: sentence 'loop' is not a tree: word 1 is its own head" in log
    assert "1 records, 2 words; 1 sentences skipped as invalid trees" in log


# --- the fixtures' tokenizers -----------------------------------------------------------------


def word_pieces(tokenizer, sentences) -> list[list[int]]:
    """Token ids of every word of ``sentences`` (lists of words), as the tokenizer splits them."""
    out = []
    for words in sentences:
        enc = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False)
        per = collections.defaultdict(list)
        for i, w in zip(enc["input_ids"], enc.word_ids()):
            per[w].append(i)
        out += [per.get(w, []) for w in range(len(words))]
    return out


@pytest.fixture(scope="module")
def ewt_test_words(tmp_path_factory):
    """The first 200 sentences of EWT test: words no tiny vocabulary was built from."""
    path = tmp_path_factory.mktemp("ewt_test") / "head.conllu"
    path.write_text(first_conllu_sentences(EWT_TEST, 200), encoding="utf-8")
    return [s.words for s in read_conllu(path)]


@pytest.fixture(scope="module")
def tiny_workflow_tokenizers(tmp_path_factory):
    """The tiny workflow's tokenizers, saved with their models and loaded back."""
    from tiny_workflow import build_models
    from transformers import AutoTokenizer

    dirs = build_models(tmp_path_factory.mktemp("tiny_workflow"))
    return {name: AutoTokenizer.from_pretrained(d) for name, d in dirs.items()}


def test_no_tiny_tokenizer_maps_words_to_unknown(ewt_test_words, tiny_loaded, tiny_workflow_tokenizers):
    tokenizers = {f"tests/{n}": tiny_loaded(n)[2] for n in ("bert", "electra", "gpt2", "llama")}
    tokenizers.update({f"tiny_workflow/{n}": t for n, t in tiny_workflow_tokenizers.items()})
    for name, t in tokenizers.items():
        pieces = word_pieces(t, ewt_test_words)
        unk = sum(t.unk_token_id in p for p in pieces) / len(pieces)
        assert unk < 0.05, f"{name}: {unk:.0%} of EWT test words contain {t.unk_token} (vocabulary {len(t)})"
        assert all(pieces), f"{name}: a word without pieces"


def test_tiny_encoders_split_words(ewt_test_words, tiny_loaded, tiny_workflow_tokenizers):
    for name, t in [
        ("tests/bert", tiny_loaded("bert")[2]),
        ("tiny_workflow/tinybert", tiny_workflow_tokenizers["tinybert"]),
    ]:
        pieces = word_pieces(t, ewt_test_words)
        split = sum(len(p) > 1 for p in pieces) / len(pieces)
        assert split > 0.1, f"{name}: only {split:.1%} of EWT test words are split into pieces"
        assert len(t) > 500, f"{name}: vocabulary {len(t)}"
    # an EWT word of the vocabulary stays whole, another one is split into the pieces it has
    t = tiny_workflow_tokenizers["tinybert"]
    assert t.tokenize("The quick unbelievable dog") == [
        "the",
        "quick",
        "un",
        "##b",
        "##e",
        "##l",
        "##i",
        "##e",
        "##v",
        "##a",
        "##b",
        "##l",
        "##e",
        "dog",
    ]
