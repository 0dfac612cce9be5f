"""Command-line flags built from spec fields: each option of `dpsynth
generate`, `encode` and `evaluate` is declared once, by its field
(``dpsynth.pipelines.spec.option``); the commands add the fields' flags to
their parsers (``add_flags``) and read the parsed flags back through the
same fields (``spec_values``). Light on purpose (argparse only): building
``--help`` must not load the pipeline's libraries."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def add_flags(group, options: type, *names: str, **changes: dict) -> None:
    """The flags of ``options``' fields ``names``, as their fields declare
    them; ``changes``: by field name, the argparse settings that differ in
    this command (e.g. `generate --images` is not required)."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    for name in names:
        field = fields[name]
        meta = field.metadata
        kwargs = {k: meta[k] for k in ("type", "choices", "metavar")
                  if meta[k] is not None}
        if meta["parse"] is not None:
            kwargs["type"] = argparse_type(meta["parse"])
        if meta["switch"] or meta["off_switch"]:
            kwargs["action"] = "store_true"
        if meta["negatable"]:
            kwargs["action"] = argparse.BooleanOptionalAction
        if meta["required"]:
            kwargs["required"] = True
        else:
            kwargs["default"] = (False if meta["off_switch"]
                                 else field.default)
        kwargs["help"] = meta["help"]
        kwargs.update(changes.get(name, {}))
        group.add_argument(meta["flag"], **kwargs)


def argparse_type(parse):
    """``parse`` for argparse: its ValueError's message is the error
    (argparse would otherwise hide it behind "invalid value")."""
    def read(text: str):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    read.__name__ = parse.__name__
    return read


def field_value(args: argparse.Namespace, field: dataclasses.Field) -> Any:
    """The parsed flag of ``field`` as the field's value (an off switch
    negated, then through its ``to_spec``)."""
    meta = field.metadata
    value = getattr(args, meta["flag"][2:].replace("-", "_"))
    if meta["off_switch"]:
        value = not value
    return meta["to_spec"](value) if meta["to_spec"] else value


def spec_values(args: argparse.Namespace, options: type, **given):
    """``options`` with each flagged field as parsed (``field_value``), and
    ``given`` for the rest (or instead)."""
    values = dict(given)
    for field in dataclasses.fields(options):
        if "flag" in field.metadata and field.name not in given:
            values[field.name] = field_value(args, field)
    return options(**values)
