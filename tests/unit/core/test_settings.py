"""The one route from config to settings (headatlas.core.settings): the helper, every settings class's defaults
against the schema's (the one place a default is written), and the sections of config/config.yaml."""

import dataclasses
import importlib
import pkgutil

import jsonschema
import pytest
import yaml
from conftest import REPO
from snakemake.utils import validate

import headatlas
from headatlas.core.settings import Settings, SettingsError, config_keys, from_section, settings_params

SCHEMAS = REPO / "workflow" / "schemas"


def _all_settings() -> list[type]:
    for mod in pkgutil.walk_packages(headatlas.__path__, "headatlas."):
        if mod.name.split(".")[-1] not in ("__main__",):
            importlib.import_module(mod.name)
    out, todo = [], list(Settings.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return sorted(out, key=lambda c: (c.__module__, c.__name__))


SETTINGS = _all_settings()


def _section(config_analysis: dict, path: str) -> dict:
    """The part of ``config['analysis']`` at a SECTION path (analysis.key[.part...])."""
    parts = path.split(".")
    assert parts[0] == "analysis", path
    out = config_analysis[parts[1]]
    for p in parts[2:]:
        out = out[p]
    return out


def _validated(analysis: dict, key: str) -> dict:
    """analysis.<key> validated against its schema, defaults filled (what common.smk's analysis_section does)."""
    section = dict(analysis.get(key) or {})
    validate(section, str(SCHEMAS / f"{key}.schema.yaml"))
    return section


def _task_schema() -> dict:
    """The schema of one finetune_tasks entry (inside config.schema.yaml)."""
    schema = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())
    return schema["properties"]["finetune_tasks"]["additionalProperties"]


def _schema_defaults(cls) -> dict:
    """The class's settings as its schema's defaults fill them (PARENT_KEYS from the enclosing section)."""
    if cls.SECTION.startswith("finetune_tasks."):
        props = _task_schema()["properties"]
        return settings_params(cls, {k: v["default"] for k, v in props.items() if "default" in v})
    key = cls.SECTION.split(".")[1]
    filled = {key: _validated({}, key)}
    return {**settings_params(cls, _section(filled, cls.SECTION)), **_parent_keys(cls, filled)}


def _parent_keys(cls, filled: dict) -> dict:
    if not cls.PARENT_KEYS:
        return {}
    parent = _section(filled, cls.SECTION.rsplit(".", 1)[0])
    return {k: parent[k] for k in cls.PARENT_KEYS}


# --- the helper ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Part(Settings):
    SECTION = "analysis.toy.part"

    size: int = 2
    ratios: tuple[float, ...] = (0.5,)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Toy(Settings):
    SECTION = "analysis.toy"
    RENAME = {"local_window": "window"}

    window: int = 2
    names: tuple[str, ...] = ("a",)
    pair: tuple[int, int] = (1, 2)
    part: _Part = dataclasses.field(default_factory=_Part)


def test_rename_tuples_and_parts():
    t = _Toy.from_config({"local_window": 5, "names": ["x", "y"], "pair": [3, 4], "part": {"ratios": [1, "1e-5"]}})
    assert t == _Toy(window=5, names=("x", "y"), pair=(3, 4), part=_Part(ratios=(1.0, 1e-5)))
    assert isinstance(t.part.ratios[0], float) and isinstance(t.names, tuple)
    assert config_keys(_Toy) == {"local_window": "window", "names": "names", "pair": "pair", "part": "part"}
    assert _Toy.from_config({}) == _Toy()


def test_unknown_key_names_its_config_path():
    with pytest.raises(
        SettingsError, match=r"^config key analysis\.toy\.window: unknown setting; known: local_window, "
    ):
        _Toy.from_config({"window": 3})  # the field name is not the config key
    with pytest.raises(
        SettingsError, match=r"^config key analysis\.toy\.part\.sise: unknown setting; known: size, ratios$"
    ):
        _Toy.from_config({"part": {"sise": 3}})
    with pytest.raises(SettingsError, match=r"config keys analysis\.x\.a, analysis\.x\.b: unknown setting"):
        from_section(_Toy, {"a": 1, "b": 2}, key="analysis.x")
    with pytest.raises(SettingsError, match=r"config key analysis\.toy\.pair: 2 items, not 3"):
        _Toy.from_config({"pair": [1, 2, 3]})
    with pytest.raises(SettingsError, match=r"config key analysis\.toy\.names: a list"):
        _Toy.from_config({"names": "x"})


def test_settings_params_picks_the_class_keys():
    section = {"activate": True, "local_window": 4, "pair": [1, 2], "part": {"size": 3, "threads": 8}, "other": 1}
    assert settings_params(_Toy, section) == {"local_window": 4, "pair": [1, 2], "part": {"size": 3}}
    assert settings_params(_Toy, section, "local_window", "part.size") == {"local_window": 4, "part": {"size": 3}}
    assert _Toy.pick(section) == _Toy(window=4, part=_Part(size=3))
    with pytest.raises(SettingsError, match="'window' is no setting of _Toy"):
        settings_params(_Toy, section, "window")
    with pytest.raises(SettingsError, match="'names.x' is no setting"):
        settings_params(_Toy, section, "names.x")


# --- every settings class ----------------------------------------------------------------------


def test_every_settings_class_is_found():
    names = {c.__name__ for c in SETTINGS}
    assert {"SieveSettings", "HypothesisSettings", "SurfaceSettings", "AblationSettings", "GeneratorConfig"} <= names
    assert len(SETTINGS) >= 18


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_settings_class_is_frozen_keyword_only(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert all(f.kw_only for f in dataclasses.fields(cls)), f"{cls.__name__}: @dataclass(frozen=True, kw_only=True)"
    assert set(cls.RENAME.values()) <= {f.name for f in dataclasses.fields(cls)}
    assert set(cls.CONVERT) <= {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_field_defaults_are_the_schema_defaults(cls):
    """A default is written in the schema; the field's copy (for library callers) must say the same, and every
    setting must be a key of the schema with a default."""
    defaults = _schema_defaults(cls)
    assert sorted(defaults) == sorted(config_keys(cls)), f"{cls.SECTION}: settings without a schema default"
    assert cls.from_config(defaults) == cls(), f"{cls.SECTION}: a field default differs from the schema's"


CONFIGS = ["config/config.yaml", "config/quick.yaml"]


def _config(name: str) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    if name != "config/config.yaml":  # --configfile on top of the Snakefile's: sections merge key by key
        _merge(config, yaml.safe_load((REPO / name).read_text()))
    return config


def _merge(base: dict, over: dict) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_config_sections_round_trip(cls, name):
    """config/config.yaml's section (after schema validation) builds the settings, and every field holds the
    config's value (as a tuple where the field is one)."""
    if cls.SECTION.startswith("finetune_tasks."):  # every task of the config (its own keys, schema defaults)
        for task_name, task in _config(name)["finetune_tasks"].items():
            jsonschema.validate(task, _task_schema())
            assert cls.of_task(task) == cls.from_config(settings_params(cls, task)), task_name
        return
    analysis = _config(name)["analysis"]
    key = cls.SECTION.split(".")[1]
    filled = {key: _validated(analysis, key)}
    section = _section(filled, cls.SECTION)
    params = settings_params(cls, section)
    s = cls.from_config({**params, **_parent_keys(cls, filled)})
    for ck, field in config_keys(cls).items():
        got = getattr(s, field)
        if field in cls.CONVERT:
            assert got == cls.CONVERT[field](params[ck])
        elif isinstance(got, Settings):
            assert got == type(got).from_config(params[ck])
        elif ck in params:
            assert _plain(got) == _plain(params[ck]), f"{cls.SECTION}.{ck}"


def test_a_class_check_keeps_its_error_type_and_names_the_section():
    from headatlas.jomyaeng.probing_tasks import GeneratorConfig, GeneratorError
    from headatlas.pande.sieves import SieveSettings

    with pytest.raises(GeneratorError, match=r"^config key analysis\.jomyaeng\.generator: generator\.tasks: unknown"):
        GeneratorConfig.from_config({"tasks": ["Parsing"]})
    with pytest.raises(ValueError, match=r"^config key analysis\.pande: local window must be >= 0, not -1"):
        SieveSettings.from_config({"local_window": -1})


def test_rule_params_come_from_the_settings_classes():
    """Every settings class of an analysis section (but the parts of another) reaches its rules as
    ``settings_params(Cls, ...)``, and no rule file lists a section's keys by hand (a ``finetune_tasks`` entry
    reaches its rule whole, files and settings)."""
    import re
    import typing

    rules = "\n".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk")))
    parts = {h for c in SETTINGS for h in typing.get_type_hints(c).values() if h in SETTINGS}
    missing = [
        c.__name__
        for c in SETTINGS
        if c not in parts
        and c.SECTION.startswith("analysis.")
        and not re.search(rf"settings_params\(\s*{c.__name__}\s*,", rules)
    ]
    assert not missing, f"rules that build these settings list their keys another way: {missing}"
    assert not re.search(r"for k in [\(\[]", rules), "a hand list of keys in a rule file"
