"""One route from a config section to a settings object (docs/architecture.md, "Settings").

A settings class is a ``@dataclass(frozen=True, kw_only=True)`` deriving from :class:`Settings`. Its fields are
the config keys of its section, by name; the class attributes say the rest:

- ``SECTION``: the config key path of the section (``analysis.pande``), named by every error;
- ``RENAME``: config key -> field name, where the two differ (a documented table per class; config keys never
  change, so users' configs keep working);
- ``CONVERT``: field name -> function of the config value, where more than the type's conversion is needed;
- ``PARENT_KEYS``: fields the rule script takes from the enclosing section (not keys of this one).

``from_section`` (``Cls.from_config``) builds the object: a tuple field gets a tuple (its items converted to
int / float as the type says), a field typed with a settings class is built from its sub-section, and a key that
is no setting of the class is an error naming its config key path. ``settings_params`` picks the class's keys
from a whole section: what a rule passes through ``params:`` (so there is no second list of keys in the rule
files); ``Cls.pick(section)`` builds from a whole section that holds other readers' keys too. Defaults are
written in the schema (``workflow/schemas/``); the field defaults are their copies for library callers, and
``tests/unit/core/test_settings.py`` checks that every one equals the schema's.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

__all__ = ["Settings", "SettingsError", "config_keys", "from_section", "settings_params"]


class SettingsError(ValueError):
    """A config section that does not build its settings; the message names the config key path."""


class Settings:
    """Base of the settings dataclasses: ``from_config(section)`` through :func:`from_section`."""

    SECTION: ClassVar[str] = ""
    RENAME: ClassVar[dict[str, str]] = {}
    CONVERT: ClassVar[dict[str, typing.Callable[[Any], Any]]] = {}
    PARENT_KEYS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, section: dict):
        """From the class's own keys (what its rule passes); any other key is an error."""
        return from_section(cls, section)

    @classmethod
    def pick(cls, section: dict):
        """From a whole validated section that holds other readers' keys too (``fused_plan``, the CLI)."""
        return from_section(cls, settings_params(cls, section))


def config_keys(cls) -> dict[str, str]:
    """Config key -> field name of every setting of ``cls``, in field order."""
    field_of = {f: k for k, f in cls.RENAME.items()}
    return {field_of.get(f.name, f.name): f.name for f in dataclasses.fields(cls) if f.init}


def _convert(hint, value, key: str):
    if isinstance(hint, type) and issubclass(hint, Settings):
        return from_section(hint, value, key=key)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: the one non-None type
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        return _convert(rest[0], value, key) if len(rest) == 1 else value
    if origin is tuple:
        if isinstance(value, (str, dict)) or not hasattr(value, "__iter__"):
            raise SettingsError(f"config key {key}: a list, not {value!r}")
        value = list(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise SettingsError(f"config key {key}: {len(args)} items, not {len(value)} ({value!r})")
        return (
            tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value))) if args else tuple(value)
        )
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)  # YAML 1.1 reads 1e-5 as a string
        except ValueError:
            raise SettingsError(f"config key {key}: a number, not {value!r}") from None
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def from_section(cls, section: dict, *, key: str | None = None):
    """The settings object of ``cls`` from its config section (keys by name, ``cls.RENAME`` where they differ).

    Keys the section lacks take the field defaults; a key that is no setting of ``cls`` raises SettingsError
    naming its config key path (``key``, default ``cls.SECTION``) and the known keys."""
    key = key or cls.SECTION or cls.__name__
    section = dict(section or {})
    known = config_keys(cls)
    unknown = [k for k in section if k not in known]
    if unknown:
        names = ", ".join(f"{key}.{k}" for k in unknown)
        raise SettingsError(
            f"config key{'s' if len(unknown) > 1 else ''} {names}: unknown setting; known: {', '.join(known)}"
        )
    hints = typing.get_type_hints(cls)
    kw = {}
    for ck, name in known.items():
        if ck not in section:
            continue
        value = section[ck]
        kw[name] = cls.CONVERT[name](value) if name in cls.CONVERT else _convert(hints[name], value, f"{key}.{ck}")
    try:
        return cls(**kw)
    except SettingsError:
        raise
    except ValueError as e:  # a check of the class (__post_init__): the same error, saying where it comes from
        raise type(e)(f"config key {key}: {e}") from e


def settings_params(cls, section: dict, *only: str) -> dict:
    """The keys of ``section`` that are settings of ``cls`` (a settings sub-section: its own keys of that part),
    as a rule passes them through ``params:``; ``only``: just these config keys (``part.key`` for a key of a
    sub-section), for a rule that reads a few of them. A name in ``only`` that is no setting is an error."""
    known = config_keys(cls)
    hints = typing.get_type_hints(cls)
    wanted: dict[str, list[str]] = {}
    for name in only:
        top, _, sub = name.partition(".")
        if top not in known or (sub and not _is_settings(hints[known[top]])):
            raise SettingsError(f"{name!r} is no setting of {cls.__name__} ({cls.SECTION}); known: {', '.join(known)}")
        wanted.setdefault(top, [])
        if sub:
            wanted[top].append(sub)
    out = {}
    for ck, name in known.items():
        if ck not in section or (only and ck not in wanted):
            continue
        value = section[ck]
        part = hints[name]
        out[ck] = settings_params(part, value, *wanted.get(ck, ())) if _is_settings(part) else value
    return out


def _is_settings(hint) -> bool:
    return isinstance(hint, type) and issubclass(hint, Settings)
