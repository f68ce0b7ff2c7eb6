"""Check a dashboard's JSON against Grafana's published schema, as the
grafana-foundation-sdk package (Apache-2.0) generates it into Python
classes: the dashboard, each panel with its own plugin's options and
fieldConfig models, and each Prometheus query.

The SDK's decoders drop what they do not know and store values without
checking them, so `problems` does both halves itself:
- round trip: decode, encode again, and every key and value we wrote must
  come back unchanged (a key the models dropped is a misspelt or unknown
  field);
- types: every decoded value must fit the model's annotation (enums,
  literals, int/str/bool, nested models; a dict passed through where the
  schema names a model is decoded with that model and checked the same way;
  these paths name the SDK's attributes, e.g. `grid_pos` for `gridPos`).
Then what the schema leaves loose: panel types and data source types the
SDK has models for, data source references naming the dashboard's data
source variable, and panels that fit Grafana's 24-column grid without
overlapping."""

from __future__ import annotations

import enum
import functools
import json
import re
import types
import typing
from typing import Any

from grafana_foundation_sdk.cog import encoder, plugins, runtime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as model

GRID_COLUMNS = 24


@functools.cache
def _registered() -> runtime.Runtime:
    plugins.register_default_plugins()
    return runtime.Runtime()


def problems(dashboard: dict[str, Any]) -> list[str]:
    """Everything in the dashboard that Grafana's schema does not accept."""
    _registered()
    out: list[str] = []
    decoded = model.Dashboard.from_json(dashboard)
    _round_trip(dashboard, decoded, "$", out)
    _check_value(decoded, model.Dashboard, "$", out)
    _check_panels(dashboard, out)
    _check_datasources(dashboard, out)
    return out


def _encoded(decoded: Any) -> Any:
    return json.loads(json.dumps(decoded, cls=encoder.JSONEncoder))


def _round_trip(ours: Any, decoded: Any, path: str, out: list[str]) -> None:
    _kept(ours, _encoded(decoded), path, out)


def _kept(ours: Any, back: Any, path: str, out: list[str]) -> None:
    """Every key and value of `ours` is in `back` (which may add defaults)."""
    if isinstance(ours, dict):
        if not isinstance(back, dict):
            out.append(f"{path}: an object, read by the schema as {back!r}")
            return
        for key, value in ours.items():
            if key not in back:
                out.append(f"{path}.{key}: not in the schema (dropped on decoding)")
            else:
                _kept(value, back[key], f"{path}.{key}", out)
    elif isinstance(ours, list):
        if not isinstance(back, list) or len(back) != len(ours):
            out.append(f"{path}: a list of {len(ours)}, read by the schema as {back!r}")
            return
        for i, (mine, theirs) in enumerate(zip(ours, back, strict=True)):
            _kept(mine, theirs, f"{path}[{i}]", out)
    elif type(ours) is not type(back) or ours != back:
        out.append(f"{path}: {ours!r} came back as {back!r}")


def _is_model(cls: Any) -> bool:
    return isinstance(cls, type) and callable(getattr(cls, "from_json", None)) \
        and callable(getattr(cls, "to_json", None))


def _check_model(obj: Any, path: str, out: list[str]) -> None:
    for name, hint in typing.get_type_hints(type(obj)).items():
        _check_value(getattr(obj, name), hint, f"{path}.{name}", out)


def _fits(value: Any, hint: Any, path: str) -> list[str]:
    found: list[str] = []
    _check_value(value, hint, path, found)
    return found


def _check_value(value: Any, hint: Any, path: str, out: list[str]) -> None:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        if _is_model(type(value)):  # a plugin's options or custom fieldConfig
            _check_model(value, path, out)
        return
    if hint is type(None):
        if value is not None:
            out.append(f"{path}: {value!r} is not null")
        return
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        if value is None and len(arms) < len(args):
            return
        # A decoded model picks its arm (Panel or RowPanel); else the first
        # arm that fits, or the reasons none did.
        chosen = [a for a in arms if _is_model(a) and isinstance(value, a)] or arms
        attempts = [_fits(value, arm, path) for arm in chosen]
        if len(attempts) == 1:
            out.extend(attempts[0])
        elif all(attempts):
            out.append(f"{path}: {value!r:.80} fits no type the schema allows here: "
                       + "; or ".join(a[0] for a in attempts))
        return
    if origin is typing.Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            out.append(f"{path}: {value!r} is not one of {list(args)}")
        return
    if origin is list:
        if not isinstance(value, list):
            out.append(f"{path}: {value!r} is not a list")
            return
        for i, item in enumerate(value):
            _check_value(item, args[0] if args else Any, f"{path}[{i}]", out)
        return
    if origin is dict:
        if not isinstance(value, dict):
            out.append(f"{path}: {value!r} is not an object")
            return
        for key, item in value.items():
            _check_value(item, args[1] if args else Any, f"{path}.{key}", out)
        return
    if not isinstance(hint, type):
        out.append(f"{path}: no check for the annotation {hint!r}")
        return
    if issubclass(hint, enum.Enum):
        allowed = [m.value for m in hint]
        if not any(value == a and type(value) in (type(a), hint) for a in allowed):
            out.append(f"{path}: {value!r} is not one of {allowed}")
        return
    if hint is cogvariants.Dataquery:
        if isinstance(value, runtime.UnknownDataquery) or not isinstance(value, hint):
            out.append(f"{path}: a query of no data source type the schema knows")
        else:
            _check_model(value, path, out)
        return
    if _is_model(hint):
        if isinstance(value, hint):
            _check_model(value, path, out)
        elif isinstance(value, dict):
            # Kept raw by its parent's decoder (a panel's links,
            # transformations): decode it here and check it the same way.
            decoded = hint.from_json(value)
            _round_trip(value, decoded, path, out)
            _check_model(decoded, path, out)
        else:
            out.append(f"{path}: {value!r} is not of type {hint.__name__}")
        return
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        out.append(f"{path}: {value!r} is not of type {hint.__name__}")


def _all_panels(dashboard: dict[str, Any]) -> typing.Iterator[tuple[str, dict[str, Any], bool]]:
    """(path, panel, on the grid as shown): a collapsed row's panels keep the
    positions they take when it is expanded."""
    for i, panel in enumerate(dashboard.get("panels", [])):
        yield f"$.panels[{i}]", panel, True
        for j, inner in enumerate(panel.get("panels", []) if panel.get("type") == "row" else []):
            yield f"$.panels[{i}].panels[{j}]", inner, False


def _check_panels(dashboard: dict[str, Any], out: list[str]) -> None:
    known = _registered().panelcfg_variants
    taken: list[tuple[str, int, int, int, int]] = []
    for path, panel, shown in _all_panels(dashboard):
        name = f"{path} ({panel.get('title', '?')})"
        kind = panel.get("type")
        if kind != "row":
            config = known.get(kind)
            if config is None or config.options_from_json_hook is None:
                out.append(f"{name}: no schema for panel type {kind!r}")
        grid = panel.get("gridPos")
        if not isinstance(grid, dict) or any(
                not isinstance(grid.get(k), int) or isinstance(grid.get(k), bool)
                for k in "hwxy"):
            out.append(f"{name}: gridPos needs integer h, w, x and y: {grid!r}")
            continue
        h, w, x, y = (grid[k] for k in "hwxy")
        if not (h >= 1 and 1 <= w <= GRID_COLUMNS and x >= 0 and x + w <= GRID_COLUMNS
                and y >= 0):
            out.append(f"{name}: gridPos {grid} is off the {GRID_COLUMNS}-column grid")
        if kind == "row" and (h, w, x) != (1, GRID_COLUMNS, 0):
            out.append(f"{name}: a row spans the grid at height 1, not {grid}")
        if not shown:
            continue
        for other, ox, oy, ow, oh in taken:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                out.append(f"{name}: gridPos {grid} overlaps {other}")
        taken.append((name, x, y, w, h))


def _datasource_refs(node: Any, path: str) -> typing.Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield f"{path}.{key}", value
            else:
                yield from _datasource_refs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _datasource_refs(item, f"{path}[{i}]")


def _check_datasources(dashboard: dict[str, Any], out: list[str]) -> None:
    """Each reference is {type, uid}: a data source type the SDK has a query
    model for, and the uid `${name}` of a data source variable of that type
    (a fixed uid would name one Grafana's data source, absent from others)."""
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    known = _registered().dataquery_variants
    for path, ref in _datasource_refs(dashboard, "$"):
        if not isinstance(ref, dict) or set(ref) != {"type", "uid"}:
            out.append(f"{path}: a data source reference is {{type, uid}}, not {ref!r}")
            continue
        found = _fits(model.DataSourceRef.from_json(ref), model.DataSourceRef, path)
        if found:
            out.extend(found)
            continue
        kind, uid = ref["type"], ref["uid"]
        if kind not in known:
            out.append(f"{path}: no schema for data source type {kind!r}")
        match = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", uid)
        variable = variables.get(match.group(1) or match.group(2)) if match else None
        if variable is None or variable.get("type") != "datasource":
            out.append(f"{path}: uid {uid!r} is not a data source variable of this dashboard")
        elif variable.get("query") != kind:
            out.append(f"{path}: type {kind!r}, but the variable {variable['name']!r} "
                       f"lists {variable.get('query')!r} data sources")
