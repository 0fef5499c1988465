"""The rule registry: `register` (a class decorator: registry name + JAX pytree), `names`,
and `make`, which builds a rule from its name or a spec string ('lenience:l=0.5'), starting
from a named preset where one is given ('sglang:preset=default': a class's `presets`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from spec_jax import categorical
from spec_jax.rules.base import Rule

_REGISTRY: dict[str, type] = {}

# The contract methods a user or verifier calls with probability vectors: `register` wraps
# them so bf16 / fp16 arguments are upcast to float32 first (`categorical.upcast`; float32
# arguments pass untouched, so the programs of float32 inputs are unchanged).
UPCAST = ('accept_prob', 'accept_all', 'replacement', 'bonus', 'induced', 'acceptance_rate',
          'induced_tree_node', 'induced_tree_node_raw', 'tree_target', 'round_law',
          'accept_block')  # fmt: skip


def _upcasting(method):
    """`method` with its array arguments upcast to float32 where they are narrower floats."""
    if getattr(method, 'upcasts', False):
        return method

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        args = [categorical.upcast(a) for a in args]
        return method(self, *args, **{k: categorical.upcast(v) for k, v in kwargs.items()})

    wrapped.upcasts = True
    return wrapped


def register(cls):
    """Class decorator: adds a rule class to the registry and registers it as a pytree.

    Apply it above `@dataclasses.dataclass(frozen=True)`. Fields named in the class's
    `static_fields` become static aux data of the pytree; every other field is a child
    (a leaf: a float parameter). Unflattening builds the instance with `object.__new__` and
    `object.__setattr__`, so it never runs `__post_init__`. The contract methods in
    `UPCAST` compute in float32 whatever the input's float width (bf16 and fp16 upcast).

    Raises:
      ValueError: the name is registered twice, `static_fields` names a field the class does
        not have, or a field whose default is not a number (or None) is not declared static.
    """
    if cls.name in _REGISTRY:
        raise ValueError(f'rule name {cls.name!r} is registered twice')
    register_pytree(cls)
    for name in UPCAST:
        if hasattr(cls, name):
            setattr(cls, name, _upcasting(getattr(cls, name)))
    _REGISTRY[cls.name] = cls
    return cls


def register_pytree(cls) -> None:
    """Registers a frozen dataclass (a rule, or a rule-like container) as a JAX pytree.

    Children: the dataclass fields not in `cls.static_fields`, in field order. Aux data: the
    values of the static fields (they must be hashable). Checks that `static_fields` names
    fields of the class and that no field with a non-numeric default (a string, say) is left
    as a leaf by mistake.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f'{cls.__name__}: register it above @dataclasses.dataclass(frozen=True)')
    field_names = tuple(f.name for f in dataclasses.fields(cls))
    static = tuple(getattr(cls, 'static_fields', ()))
    unknown = [n for n in static if n not in field_names]
    if unknown:
        raise ValueError(f'{cls.__name__}: static_fields {unknown} are not fields ({field_names})')
    for f in dataclasses.fields(cls):
        default = f.default
        numeric = (
            default is None
            or default is dataclasses.MISSING
            or (isinstance(default, (int, float)) and not isinstance(default, bool))
        )
        if f.name not in static and not numeric:
            raise ValueError(
                f'{cls.__name__}: field {f.name!r} has default {default!r}, which is not a '
                'float parameter; list it in static_fields'
            )
    children = tuple(n for n in field_names if n not in static)
    keys = tuple(jax.tree_util.GetAttrKey(n) for n in children)

    def flatten_with_keys(obj):
        aux = tuple(getattr(obj, n) for n in static)
        return tuple(zip(keys, (getattr(obj, n) for n in children), strict=True)), aux

    def flatten(obj):
        return tuple(getattr(obj, n) for n in children), tuple(getattr(obj, n) for n in static)

    def unflatten(aux, values):
        obj = object.__new__(cls)  # No __init__ / __post_init__: values may be tracers.
        for n, v in zip(static, aux, strict=True):
            object.__setattr__(obj, n, v)
        for n, v in zip(children, values, strict=True):
            object.__setattr__(obj, n, v)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def names() -> tuple[str, ...]:
    """The registered rule names, sorted."""
    return tuple(sorted(_REGISTRY))


def make(name: str, **params) -> Rule:
    """Builds a registered rule, e.g. `make('lenience', l=0.5)`.

    Args:
      name: a registered rule name (see `names()`), or a spec string 'name:key=value,...'
        (e.g. 'speccascade:deferral=token_v3,alpha=0.5'); keyword params override the spec.
      **params: the rule's parameters. `preset='default'` (or 'name:preset=default') starts
        from the class's named preset (its `presets`: an engine's defaults), which the other
        parameters override.

    Raises:
      ValueError: unknown name, unknown parameter or preset, or a parameter outside its range.
    """
    if ':' in name:
        name, spec = name.split(':', 1)
        parsed = {}
        for item in filter(None, (s.strip() for s in spec.split(','))):
            if '=' not in item:
                raise ValueError(f'rule spec item {item!r} is not of the form key=value')
            key, value = (s.strip() for s in item.split('=', 1))
            parsed[key] = _parse_value(value)
        params = {**parsed, **params}
    if name not in _REGISTRY:
        raise ValueError(f'unknown rule {name!r}; known rules: {", ".join(names())}')
    cls = _REGISTRY[name]
    if 'preset' in params:
        params = {**preset(cls, str(params.pop('preset'))), **params}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(params) - fields
    if unknown:
        raise ValueError(
            f'rule {name!r} has no parameter(s) {sorted(unknown)}; its parameters: '
            f'{sorted(fields) or "none"}'
        )
    return cls(**params)


def preset(cls, name: str) -> dict[str, Any]:
    """The parameters of a rule class's named preset (`cls.presets`, {} when it has none).

    Raises:
      ValueError: the class has no preset of that name (the message lists its presets).
    """
    presets = getattr(cls, 'presets', None) or {}
    if name not in presets:
        raise ValueError(
            f'rule {cls.name!r} has no preset {name!r}; its presets: '
            f'{", ".join(sorted(presets)) or "none"}'
        )
    return dict(presets[name])


def _parse_value(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
