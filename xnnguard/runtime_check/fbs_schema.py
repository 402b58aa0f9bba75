"""Field layouts read from the FlatBuffers schemas that the installed ExecuTorch ships.

The verifier reads a table's fields by name (``"num_externs"``, ``"xnode_union"``) and takes each name's
vtable slot, type and default from ExecuTorch's own ``program.fbs`` and XNNPACK ``runtime_schema.fbs``.
So a release that adds an XNNPACK op or a field is read correctly without a hand-kept table of slot
numbers. Only the subset those schemas use is understood: ``namespace``, ``include``, ``enum``,
``union``, ``table`` (with deprecated fields, defaults and attributes); anything else is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path

from xnnguard.boundary.package_files import PackageFileError, package_file

__all__ = ["SCALAR_FORMATS", "FieldDef", "FieldKind", "Schema", "SchemaError", "executorch_schema", "load_schema"]


class SchemaError(ValueError):
    """The schema file uses something this reader does not understand."""


# FlatBuffers scalar type -> struct format (little-endian).
SCALAR_FORMATS: dict[str, str] = {
    "bool": "<?",
    "byte": "<b",
    "int8": "<b",
    "ubyte": "<B",
    "uint8": "<B",
    "short": "<h",
    "int16": "<h",
    "ushort": "<H",
    "uint16": "<H",
    "int": "<i",
    "int32": "<i",
    "uint": "<I",
    "uint32": "<I",
    "long": "<q",
    "int64": "<q",
    "ulong": "<Q",
    "uint64": "<Q",
    "float": "<f",
    "float32": "<f",
    "double": "<d",
    "float64": "<d",
}


class FieldKind(Enum):
    SCALAR = "scalar"
    STRING = "string"
    TABLE = "table"
    UNION = "union"  # the value slot; the type tag is the slot before it
    SCALAR_VECTOR = "scalar_vector"
    TABLE_VECTOR = "table_vector"
    STRING_VECTOR = "string_vector"


@dataclass(frozen=True)
class FieldDef:
    name: str
    slot: int
    kind: FieldKind
    scalar_format: str = ""  # for SCALAR and SCALAR_VECTOR
    default: float | int | bool = 0
    ref: str = ""  # table or union name for TABLE, TABLE_VECTOR and UNION


@dataclass
class Schema:
    tables: dict[str, dict[str, FieldDef]] = field(default_factory=dict)
    # union name -> member table names, index 0 is NONE (an absent value)
    unions: dict[str, list[str]] = field(default_factory=dict)
    # union name -> member names (the name in the union; the table may be shared, e.g. XNNAdd: _XNNNode2x1)
    union_members: dict[str, list[str]] = field(default_factory=dict)
    enums: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)


_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][A-Za-z0-9_.]*|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[{}\[\]():;=,]')
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


class _Tokens:
    def __init__(self, text: str, origin: str) -> None:
        self.items = _TOKEN.findall(_COMMENT.sub(" ", text))
        self.pos = 0
        self.origin = origin

    def peek(self) -> str:
        return self.items[self.pos] if self.pos < len(self.items) else ""

    def next(self) -> str:
        token = self.peek()
        if not token:
            raise SchemaError(f"{self.origin}: unexpected end of schema")
        self.pos += 1
        return token

    def expect(self, token: str) -> None:
        got = self.next()
        if got != token:
            raise SchemaError(f"{self.origin}: expected {token!r}, got {got!r}")

    def skip_statement(self) -> None:
        while self.next() != ";":
            pass


def _parse(path: Path, schema: Schema, raw_tables: dict[str, list[tuple[str, str, str | None, bool]]]) -> None:
    tokens = _Tokens(path.read_text(), path.name)
    while tokens.peek():
        keyword = tokens.next()
        if keyword == "include":
            _parse(path.parent / tokens.next().strip('"'), schema, raw_tables)
            tokens.expect(";")
        elif keyword in ("namespace", "file_identifier", "file_extension", "root_type", "attribute"):
            tokens.skip_statement()
        elif keyword == "enum":
            name = tokens.next()
            tokens.expect(":")
            base = tokens.next()
            tokens.expect("{")
            values: dict[str, int] = {}
            next_value = 0
            while tokens.peek() != "}":
                member = tokens.next()
                if tokens.peek() == "=":
                    tokens.next()
                    next_value = int(tokens.next())
                values[member] = next_value
                next_value += 1
                if tokens.peek() == ",":
                    tokens.next()
            tokens.expect("}")
            schema.enums[name] = (base, values)
        elif keyword == "union":
            name = tokens.next()
            tokens.expect("{")
            members, tables = ["NONE"], ["NONE"]
            while tokens.peek() != "}":
                member = tokens.next()
                table = member
                if tokens.peek() == ":":
                    tokens.next()
                    table = tokens.next()
                members.append(member)
                tables.append(table)
                if tokens.peek() == ",":
                    tokens.next()
            tokens.expect("}")
            schema.unions[name] = tables
            schema.union_members[name] = members
        elif keyword == "table":
            name = tokens.next()
            tokens.expect("{")
            fields: list[tuple[str, str, str | None, bool]] = []
            while tokens.peek() != "}":
                field_name = tokens.next()
                tokens.expect(":")
                if tokens.peek() == "[":
                    tokens.next()
                    type_name = "[" + tokens.next() + "]"
                    tokens.expect("]")
                else:
                    type_name = tokens.next()
                default = None
                if tokens.peek() == "=":
                    tokens.next()
                    default = tokens.next()
                deprecated = False
                if tokens.peek() == "(":
                    while (token := tokens.next()) != ")":
                        deprecated = deprecated or token == "deprecated"
                tokens.expect(";")
                fields.append((field_name, type_name, default, deprecated))
            tokens.expect("}")
            raw_tables[name] = fields
        else:
            raise SchemaError(f"{path.name}: unsupported declaration {keyword!r}")


def _unqualified(type_name: str) -> str:
    """``executorch_flatbuffer.ScalarType`` -> ``ScalarType``: names are unique across the schemas read here."""
    return type_name.rsplit(".", 1)[-1]


def _field_def(schema: Schema, name: str, type_name: str, default: str | None, slot: int) -> FieldDef:
    if type_name.startswith("["):
        inner = _unqualified(type_name[1:-1])
        if inner == "string":
            return FieldDef(name, slot, FieldKind.STRING_VECTOR)
        scalar = schema.enums[inner][0] if inner in schema.enums else inner
        if scalar in SCALAR_FORMATS:
            return FieldDef(name, slot, FieldKind.SCALAR_VECTOR, scalar_format=SCALAR_FORMATS[scalar])
        return FieldDef(name, slot, FieldKind.TABLE_VECTOR, ref=inner)
    type_name = _unqualified(type_name)
    if type_name == "string":
        return FieldDef(name, slot, FieldKind.STRING)
    if type_name in schema.unions:
        return FieldDef(name, slot, FieldKind.UNION, ref=type_name)
    if type_name in schema.enums:
        base, values = schema.enums[type_name]
        member = values.get(default, 0) if default is not None else 0
        return FieldDef(name, slot, FieldKind.SCALAR, scalar_format=SCALAR_FORMATS[base], default=member)
    if type_name in SCALAR_FORMATS:
        fmt = SCALAR_FORMATS[type_name]
        value: float | int | bool = 0
        if default is not None:
            value = default == "true" if fmt == "<?" else (float(default) if fmt in ("<f", "<d") else int(default))
        return FieldDef(name, slot, FieldKind.SCALAR, scalar_format=fmt, default=value)
    return FieldDef(name, slot, FieldKind.TABLE, ref=type_name)


@cache
def load_schema(path: Path) -> Schema:
    """Parse ``path`` (and its includes) into field layouts; cached per file."""
    schema = Schema()
    raw_tables: dict[str, list[tuple[str, str, str | None, bool]]] = {}
    _parse(path, schema, raw_tables)
    for table_name, fields in raw_tables.items():
        layout: dict[str, FieldDef] = {}
        slot = 0
        for field_name, type_name, default, deprecated in fields:
            is_union = _unqualified(type_name) in schema.unions
            if is_union:
                slot += 1  # a union takes two slots: its type tag ("<name>_type"), then its value
            if not deprecated:
                layout[field_name] = _field_def(schema, field_name, type_name, default, slot)
            slot += 1
        schema.tables[table_name] = layout
    return schema


def executorch_schema(relative_path: str) -> Schema:
    """A schema shipped inside the installed ``executorch`` package, e.g. ``"exir/_serialize/program.fbs"``.

    Found through the package's location rather than by importing the subpackage: importing
    ``executorch.backends.xnnpack`` pulls in the whole export stack, which a file check does not need.
    """
    try:
        return load_schema(package_file(relative_path))
    except PackageFileError as error:
        raise SchemaError(str(error)) from error
