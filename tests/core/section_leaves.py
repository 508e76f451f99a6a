"""Dotted leaves of a settings dataclass and of a config tree, to compare them key for key."""
from __future__ import annotations

import dataclasses
import typing


def field_leaves(cls, prefix: str = "", skip: tuple[str, ...] = ()) -> dict[str, dataclasses.Field]:
  """{dotted key: field} of every leaf of section ``cls`` (nested dataclasses flattened; top-level ``skip`` left
  out)."""
  out = {}
  for field in dataclasses.fields(cls):
    if field.name in skip:
      continue
    kind = typing.get_type_hints(cls)[field.name]
    if dataclasses.is_dataclass(kind):
      out.update(field_leaves(kind, f"{prefix}{field.name}."))
    else:
      out[f"{prefix}{field.name}"] = field
  return out


def tree_leaves(tree: dict, prefix: str = "", skip: tuple[str, ...] = ()) -> dict[str, object]:
  """{dotted key: value} of every leaf of ``tree`` (a config's ``to_dict()``; top-level ``skip`` left out)."""
  out = {}
  for key, value in tree.items():
    if key in skip:
      continue
    if isinstance(value, dict):
      out.update(tree_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out
