"""Validation errors of a request body in plain words.

pydantic reports where a value failed in its own terms: union members (``max_cost_usd`` is
``float | None``, so one bad value fails twice, once as ``constrained-float`` and once as ``none``),
validator wrappers (``function-after[_size_xor_parameters(), ArraySpec]``), regexes for names. A
person writing a job spec needs the field (``resources.gpus``), what is wrong in words, the values
allowed, and a guess when a field or value looks mistyped. ``describe`` turns the errors of one body
into that, one detail per field, knowing only the body's model class and the words for its patterns.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

#: pydantic's names for union members and validator wrappers in ``loc``: never a field of ours, nor
#: a key of a map (env names, GPU models).
_WRAPPER = re.compile(
    r"^(none|(constrained|function|lax|strict|json|tagged|typed|is|model)-.*|.*[\[\]()].*)$"
)
#: Type names and model classes pydantic adds for union members; could be a map's key, never a field.
_TYPE = re.compile(
    r"^(int|float|str|bool|list|dict|tuple|set|literal|enum|model|json|union|[A-Z][a-z]+[A-Za-z]*)$"
)
#: Fields whose values are maps with keys of the user's choosing (an env var, a parameter name).
FREE_KEYS = frozenset({"env", "secrets", "gpus"})
#: How a detail names the body itself (a rule over several fields, or a body that is no object).
WHOLE = "spec"


def clean_loc(loc: Sequence[Any]) -> tuple[str | int, ...]:
    """``loc`` without its ``body`` prefix and pydantic's union and wrapper tags."""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    out: list[str | int] = []
    for p in parts:
        free = bool(out) and out[-1] in FREE_KEYS
        if isinstance(p, int) or (not _WRAPPER.match(p) and (free or not _TYPE.match(p))):
            out.append(p)
    return tuple(out)


def dotted(loc: Sequence[str | int]) -> str:
    """``resources.gpus``, ``data[0].source``, ``env.MY_VAR``; the body itself is ``spec``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or WHOLE


def _pattern_key(loc: Sequence[str | int]) -> str:
    """``data.0.source`` as ``data.*.source``; a free map's key as ``env.*``."""
    out: list[str] = []
    for i, p in enumerate(loc):
        free = i > 0 and loc[i - 1] in FREE_KEYS
        out.append("*" if isinstance(p, int) or free else str(p))
    return ".".join(out)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Annotated, unions, lists and dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_in(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple, dict, set, frozenset):
        return [m for a in get_args(annotation) for m in _models_in(a)]
    return []


def model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model of the object at ``loc`` (list indexes and map keys stepped over)."""
    current: type[BaseModel] | None = model
    for p in loc:
        if current is None:
            return None
        if isinstance(p, int) or p not in current.model_fields:
            continue
        found = _models_in(current.model_fields[p].annotation)
        current = found[0] if found else None
    return current


def _public_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, f in model.model_fields.items() if not f.exclude and name != "array_task"]


def did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    by_folded = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[close[0]] if close else None


def _quoted(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 60 else text[:57] + "...'"


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _plain_number(v: Any) -> Any:
    """``0.0`` as ``0``, ``1e7`` as ``10000000``: bounds read as written in the docs."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _allowed(err: Mapping[str, Any]) -> list[str]:
    expected = str((err.get("ctx") or {}).get("expected", ""))
    return re.findall(r"'([^']*)'", expected)


_KIND = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "dict_type": "an object (a mapping of names to values)",
    "model_type": "an object (a mapping of fields)",
    "model_attributes_type": "an object (a mapping of fields)",
}
_BOUND = {
    "greater_than": "more than {gt}",
    "greater_than_equal": "at least {ge}",
    "less_than": "less than {lt}",
    "less_than_equal": "at most {le}",
    "string_too_short": "at least {min_length} characters long",
    "string_too_long": "at most {max_length} characters long",
    "too_short": "at least {min_length} items",
    "too_long": "at most {max_length} items",
    "multiple_of": "a multiple of {multiple_of}",
}


def _optional(model: type[BaseModel], loc: tuple[str | int, ...]) -> bool:
    """Whether the field at ``loc`` has a default (may be left out)."""
    parent = model_at(model, loc[:-1]) if loc else None
    name = loc[-1] if loc else None
    return (
        parent is not None
        and isinstance(name, str)
        and name in parent.model_fields
        and not (parent.model_fields[name].is_required())
    )


def _unknown_field(loc: tuple[str | int, ...], model: type[BaseModel]) -> dict[str, Any]:
    parent = model_at(model, loc[:-1])
    choices = _public_fields(parent) if parent else []
    out: dict[str, Any] = {"message": f"unknown field '{loc[-1]}'" if loc else "unknown field"}
    guess = did_you_mean(str(loc[-1]), choices) if loc and choices else None
    if guess:
        out["message"] += f": did you mean '{guess}'?"
        out["did_you_mean"] = guess
    if choices:
        out["allowed"] = choices
    return out


def _not_allowed(err: Mapping[str, Any], value: Any) -> dict[str, Any]:
    allowed = _allowed(err)
    out: dict[str, Any] = {
        "message": f"{_quoted(value)} is not allowed; use one of {', '.join(allowed)}",
        "allowed": allowed,
    }
    guess = did_you_mean(value, allowed) if isinstance(value, str) else None
    if guess:
        out["message"] += f" (did you mean '{guess}'?)"
        out["did_you_mean"] = guess
    return out


def _words(
    err: Mapping[str, Any], loc: tuple[str | int, ...], model: type[BaseModel], patterns: Mapping[str, str]
) -> dict[str, Any]:
    kind = str(err.get("type", ""))
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_field(loc, model)
    if kind == "missing":
        return {"message": "is required"}
    if kind in ("enum", "literal_error"):
        return _not_allowed(err, value)
    if kind == "string_pattern_mismatch":
        form = patterns.get(_pattern_key(loc), "does not have the expected form")
        return {"message": f"{_quoted(value)} {form}"}
    if kind in _KIND:
        message = f"must be {_KIND[kind]}"
        if isinstance(value, str) and kind.startswith(("int", "float", "bool")):
            message += f", not the text {_quoted(value)}"
            if _numeric(value) or value.lower() in ("true", "false"):
                message += " (write it without quotes)"
        elif value is None:
            message += ", not null" + (
                " (leave the field out for its default)" if _optional(model, loc) else ""
            )
        return {"message": message}
    if kind in _BOUND:
        ctx = {k: _plain_number(v) for k, v in ctx.items()}
        return {
            "message": f"must be {_BOUND[kind].format(**ctx)}"
            + (f" (got {_quoted(value)})" if kind.startswith(("greater", "less")) else "")
        }
    text = str(err.get("msg", "is not valid")).removeprefix("Value error, ")
    return {"message": text}


def _with_choices(words: dict[str, Any], value: Any, choices: Sequence[str] | None) -> dict[str, Any]:
    """A field with a closed set of values (``choices``, e.g. the GPU models) lists them, with a guess."""
    if choices is None:
        return words
    words = {**words, "allowed": list(choices)}
    guess = did_you_mean(value, choices) if isinstance(value, str) else None
    if guess is not None and "did_you_mean" not in words:
        words["did_you_mean"] = guess
    return words


def describe(
    errors: Sequence[Mapping[str, Any]],
    model: type[BaseModel] | None,
    patterns: Mapping[str, str],
    choices: Mapping[str, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """One detail per problem: ``{"field", "message", "allowed"?, "did_you_mean"?}``, where
    ``message`` starts with the dotted field. A union's "should be None" is left out when another
    member says more; the same words for the same field are given once."""
    cleaned = [(clean_loc(e.get("loc", ())), e) for e in errors]
    said_more = {loc for loc, e in cleaned if e.get("type") != "none_required"}

    def covered(loc: tuple[str | int, ...]) -> bool:
        return any(other[: len(loc)] == loc for other in said_more)

    details: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for loc, err in cleaned:
        if err.get("type") == "none_required" and covered(loc):
            continue
        if model is None:
            words = {"message": str(err.get("msg", "is not valid")).removeprefix("Value error, ")}
        elif not loc and err.get("type") in ("model_type", "model_attributes_type", "dict_type"):
            words = {"message": "must be a JSON object (a job spec: name, image or code, command, ...)"}
        else:
            words = _words(err, loc, model, patterns)
            words = _with_choices(words, err.get("input"), (choices or {}).get(_pattern_key(loc)))
        field = dotted(loc)
        key = (field, words["message"])
        if key in seen:
            continue
        seen.add(key)
        details.append({"field": field, **words, "message": f"{field}: {words['message']}"})
    return details
