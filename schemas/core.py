"""The tiny table-definition DSL shared by every schema module."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pyarrow as pa


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool = True
    comment: str = ""

    def arrow_field(self) -> pa.Field:
        meta = {b"comment": self.comment.encode()} if self.comment else None
        return pa.field(self.name, self.type, nullable=self.nullable, metadata=meta)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple
    comment: str = ""
    partition_by: tuple = field(default_factory=tuple)

    @staticmethod
    def of(name: str, columns: Sequence[Column], comment: str = "", partition_by: Sequence[str] = ()) -> "Table":
        names = [c.name for c in columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column in {name}: {names}")
        return Table(name, tuple(columns), comment, tuple(partition_by))

    @property
    def names(self) -> list:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def arrow_schema(self, exclude: Sequence[str] = ()) -> pa.Schema:
        return pa.schema([c.arrow_field() for c in self.columns if c.name not in exclude])

    def with_columns(self, name: str, before: Sequence[Column] = (), after: Sequence[Column] = (),
                     exclude: Sequence[str] = ()) -> "Table":
        cols = [*before, *(c for c in self.columns if c.name not in exclude), *after]
        return Table.of(name, cols, self.comment, self.partition_by)

    def spark_schema(self, exclude: Sequence[str] = ()):
        from pyspark.sql import types as T

        return T.StructType([
            T.StructField(c.name, spark_type_of(c.type), c.nullable,
                          {"comment": c.comment} if c.comment else {})
            for c in self.columns if c.name not in exclude
        ])

    def ddl(self, exclude: Sequence[str] = ()) -> str:
        return self.spark_schema(exclude).simpleString()


def spark_type_of(t: pa.DataType):
    """Arrow type -> Spark type, for the types this project uses."""
    from pyspark.sql import types as T

    if pa.types.is_int8(t):
        return T.ByteType()
    if pa.types.is_int16(t):
        return T.ShortType()
    if pa.types.is_int32(t):
        return T.IntegerType()
    if pa.types.is_int64(t):
        return T.LongType()
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_float64(t):
        return T.DoubleType()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return T.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return T.BinaryType()
    if pa.types.is_timestamp(t):
        return T.TimestampType()
    if pa.types.is_date32(t):
        return T.DateType()
    if pa.types.is_map(t):
        return T.MapType(spark_type_of(t.key_type), spark_type_of(t.item_type), True)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return T.ArrayType(spark_type_of(t.value_type), True)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type_of(f.type), f.nullable) for f in t])
    raise TypeError(f"no Spark type for Arrow {t}")
