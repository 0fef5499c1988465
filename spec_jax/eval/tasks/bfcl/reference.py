"""BFCL reference responses (what tests score as correct): a possible answer as concrete calls
(`reference_calls`), calls rendered as the text a model would write (`render_calls`: Python
literals, or Java/JavaScript source for the parameters' declared types), and the two together
(`reference_response`, a text the checker accepts).
"""

from __future__ import annotations

from typing import Any

from spec_jax.eval.tasks.base import Item
from spec_jax.eval.tasks.bfcl.check import _find


def _pick(allowed: list, spec: dict) -> Any:
    """The first allowed value, with the allowed-value lists inside dicts resolved too."""
    value = allowed[0]
    kind = spec.get('type')
    dict_like = kind in ('dict', 'HashMap')
    element_dicts = kind in ('array', 'ArrayList', 'Array') and (
        spec.get('items', {}).get('type') == 'dict'
    )

    def resolve(d: Any) -> Any:
        if not isinstance(d, dict) or not all(isinstance(v, list) for v in d.values()):
            return d
        return {k: v[0] for k, v in d.items() if v and v[0] != ''}

    if dict_like:
        return resolve(value)
    if element_dicts and isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def reference_calls(item: Item) -> list[dict]:
    """The possible answer of `item` as concrete calls: the first allowed value of each
    parameter (left out where that is '' or the schema lacks the parameter, unless the schema
    requires it); [] for irrelevance."""
    functions = item.gold['functions']
    calls = []
    for answer in item.gold['ground_truth'] or []:
        name, params = next(iter(answer.items()))
        schema = (_find(functions, name) or {}).get('parameters', {})
        properties, required = schema.get('properties', {}), schema.get('required', [])
        args = {}
        for param, allowed in params.items():
            if '' in allowed and (param not in properties or allowed[0] == ''):
                if param not in required:
                    continue  # Optional (or undocumented): left out.
            values = [a for a in allowed if a != '']
            if values:
                args[param] = _pick(values, properties.get(param, {}))
        calls.append({name: args})
    return calls


def _java_literal(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _java_source(value: Any, spec: dict) -> str:
    kind = spec.get('type')
    element = spec.get('items', {}).get('type')
    if kind in ('String', 'any') and isinstance(value, str):
        return f'"{value}"'
    if kind == 'char':
        return f"'{value}'"
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if kind == 'long':
        return f'{value}L'
    if kind == 'float':
        return f'{float(value)!r}f'
    if kind == 'double':
        return repr(float(value))
    if kind == 'Array' and isinstance(value, list):
        bare = element in ('String', 'any', 'char')
        items = [str(v) if bare else _java_source(v, {'type': element}) for v in value]
        return f'new {element or "Object"}[]{{{", ".join(items)}}}'
    if kind == 'ArrayList' and isinstance(value, list):
        if not value:
            return 'new ArrayList<>()'
        items = [_java_source(v, {'type': element}) for v in value]
        return f'new ArrayList<>(Arrays.asList({", ".join(items)}))'
    if kind == 'HashMap' and isinstance(value, dict):
        puts = ' '.join(f'put("{k}", {_java_literal(v)});' for k, v in value.items())
        return f'new HashMap<String, Object>() {{{{ {puts} }}}}' if puts else 'new HashMap<>()'
    return _java_literal(value)


def _js_source(value: Any, spec: dict) -> str:
    kind = spec.get('type')
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return f"'{value}'" if '"' in value else f'"{value}"'
    if kind == 'Bigint':
        return f'{value}n'
    if isinstance(value, list):
        element = {'type': spec.get('items', {}).get('type')}
        return '[' + ', '.join(_js_source(v, element) for v in value) + ']'
    if isinstance(value, dict):
        pairs = ', '.join(f'"{k}": {_js_source(v, {})}' for k, v in value.items())
        return '{' + pairs + '}'
    return repr(value)


def render_calls(calls: list[dict], functions: list[dict], language: str = 'python') -> str:
    """Concrete calls [{name: {arg: value}}] as the text a model would write: Python
    literals, or Java/JavaScript source for the parameters' declared types."""
    out = []
    for call in calls:
        name, args = next(iter(call.items()))
        properties = (_find(functions, name) or {}).get('parameters', {}).get('properties', {})
        parts = []
        for param, value in args.items():
            spec = properties.get(param, {})
            if language == 'python':
                source = repr(value)
            elif language == 'java':
                source = _java_source(value, spec)
            else:
                source = _js_source(value, spec)
            parts.append(f'{param}={source}')
        out.append(f'{name}({", ".join(parts)})')
    return '[' + ', '.join(out) + ']'


def reference_response(item: Item) -> str:
    """A response that the checker accepts for `item` (its reference calls, rendered)."""
    return render_calls(reference_calls(item), item.gold['functions'], item.meta['language'])
