"""Kubernetes resource quantities: parsed once so that memory can be compared and summed."""

from __future__ import annotations

import re
from decimal import Decimal

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "m": Decimal("0.001")}
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?$")

GIB = 2**30
MIB = 2**20


class Quantity(str):
    """A quantity as written (``24Gi``: what is rendered, unchanged) and its value, parsed once when the
    config is validated (config/values.py Memory and Cpu); what the plan reads downstream."""

    __slots__ = ("value",)
    value: Decimal  # base units: bytes, or cores

    def __new__(cls, text: str) -> "Quantity":
        made = super().__new__(cls, text)
        made.value = _parse(text)
        return made

    @property
    def gib(self) -> float:
        return float(self.value / GIB)

    def __reduce__(self):  # pickles and copies as itself
        return (Quantity, (str(self),))


def parse_quantity(text: str) -> Decimal:
    """The value of a quantity such as ``24Gi`` or ``500m`` in base units (bytes, cores): a validated
    config's are parsed already (Quantity)."""
    if isinstance(text, Quantity):
        return text.value
    return _parse(text)


def _parse(text: str) -> Decimal:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (examples: 24Gi, 512Mi, 500m, 2)")
    number = Decimal(match["num"])
    suffix = match["suffix"]
    if suffix is None:
        return number
    return number * Decimal(_BINARY.get(suffix) or _DECIMAL[suffix])


def gib(text: str) -> float:
    """A memory quantity in GiB."""
    return float(parse_quantity(text) / GIB)
