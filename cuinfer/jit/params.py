"""Kernel parameter structs: one field list generates both the C++ struct and the matching aligned NumPy dtype.

Every kernel takes its parameters as structs by value (``const __grid_constant__ Params p``), so adding a field never
changes the launch signature, and a ``static_assert`` on size and alignment catches any drift between the two sides.
A field's kind is a scalar kind (below) or another ``ParamStruct`` (a nested struct: a variant's parameters inside
``VariantParams``); a nested field is packed from a dict of its own fields.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

# kind -> (C++ type, NumPy dtype)
_KINDS: dict[str, tuple[str, str]] = {
    "ptr": ("void*", "<u8"),
    "i32": ("int", "<i4"),
    "u32": ("unsigned int", "<u4"),
    "i64": ("long long", "<i8"),
    "f32": ("float", "<f4"),
    "f64": ("double", "<f8"),
    # typed device pointers (a variant's array parameters: params.sinks[qo_head] reads a float)
    "i32*": ("const int*", "<u8"),
    "u32*": ("const unsigned int*", "<u8"),
    "i64*": ("const long long*", "<u8"),
    "f32*": ("const float*", "<u8"),
    "f64*": ("const double*", "<u8"),
}


@dataclass(frozen=True)
class ParamStruct:
    """A by-value kernel parameter struct.

    >>> P = ParamStruct("MergeParams", (("o", "ptr"), ("rows", "i32"), ("scale", "f32")))
    >>> P.pack(o=0x7F00, rows=3, scale=0.5)["rows"]
    np.int32(3)
    """

    name: str
    fields: tuple[tuple[str, str | ParamStruct], ...]

    def __post_init__(self) -> None:
        if not self.fields:
            raise ValueError(f"{self.name} has no fields (a C++ empty struct has size 1, a NumPy one 0): add one")
        seen = set()
        for field, kind in self.fields:
            if not isinstance(kind, ParamStruct) and kind not in _KINDS:
                raise ValueError(
                    f"{self.name}.{field} has kind {kind!r}; kinds are {', '.join(_KINDS)} or a nested ParamStruct"
                )
            if field in seen:
                raise ValueError(f"{self.name} declares field {field!r} twice")
            seen.add(field)

        object.__setattr__(self, "_names", tuple(f for f, _ in self.fields))
        getter = operator.itemgetter(*self._names)
        # itemgetter of one name returns the bare value, not a 1-tuple
        object.__setattr__(self, "_getter", getter if len(self._names) > 1 else (lambda v: (getter(v),)))
        object.__setattr__(
            self, "_nested", tuple(i for i, (_, k) in enumerate(self.fields) if isinstance(k, ParamStruct))
        )
        dt = [(f, k.numpy_dtype if isinstance(k, ParamStruct) else _KINDS[k][1]) for f, k in self.fields]
        object.__setattr__(self, "_dtype", np.dtype(dt, align=True))

    @property
    def numpy_dtype(self) -> np.dtype:
        return self._dtype

    def nested_structs(self) -> list[ParamStruct]:
        """The structs of nested fields, innermost first, each once."""
        out: list[ParamStruct] = []
        for _, k in self.fields:
            if isinstance(k, ParamStruct):
                for sub in [*k.nested_structs(), k]:
                    if sub not in out:
                        out.append(sub)
        return out

    def c_decl(self, nested: bool = True) -> str:
        """C++ declaration with layout checks against the NumPy dtype.

        NVRTC has no ``offsetof``; fields are emitted in order with natural alignment on both sides, so equal size and
        alignment leave no room for a field to sit elsewhere.
        """
        dt = self.numpy_dtype
        lines = []
        for sub in self.nested_structs() if nested else ():
            lines.append(sub.c_decl(nested=False).rstrip("\n"))
        lines.append(f"struct {self.name} {{")
        lines += [f"  {k.name if isinstance(k, ParamStruct) else _KINDS[k][0]} {f};" for f, k in self.fields]
        lines.append("};")
        lines.append(
            f'static_assert(sizeof({self.name}) == {dt.itemsize}, "{self.name}: size differs from the NumPy dtype");'
        )
        lines.append(
            f'static_assert(alignof({self.name}) == {dt.alignment}, "{self.name}: alignment differs from NumPy");'
        )
        return "\n".join(lines) + "\n"

    def pack(self, **values: int | float) -> np.void:
        """A by-value struct for ``Kernel.launch``; every field must be given (a missing pointer is a bug).

        One tuple assignment (a few microseconds): this runs on every launch, on the host path of ``run()``.
        """
        try:
            row = self._getter(values)  # operator.itemgetter: the field tuple in one C call
        except KeyError:
            row = None
        if row is None or len(values) != len(self._names):
            names = set(self._names)
            missing = names - values.keys()
            extra = values.keys() - names
            raise TypeError(f"{self.name}.pack(): missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
        if self._nested:
            row = list(row)
            for i in self._nested:
                sub = self.fields[i][1]
                row[i] = sub.pack(**row[i]) if isinstance(row[i], dict) else row[i]
            row = tuple(row)
        arr = np.empty((), dtype=self._dtype)
        arr[()] = row
        return arr[()]
