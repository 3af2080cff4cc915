"""Registry: a handler whose other annotations cannot be resolved still registers.

(No ``from __future__ import annotations`` here: the handler's first annotation must be the
class itself, as in a module that does not postpone annotations.)"""

import pytest

import rpc


def test_unresolvable_annotation_of_another_parameter_falls_back() -> None:
    reg = rpc.Registry()

    @reg.handle("first_typed")
    def first_typed(n: int, context: "Missing" = None) -> int:  # type: ignore[name-defined]  # noqa: F821
        return n

    handler = reg.get("first_typed")
    assert handler is not None
    assert handler.annotation is int  # get_type_hints failed (NameError): the raw annotations
    with pytest.raises(rpc.PayloadError):
        handler.decode(b'"not an int"')
    assert handler.decode(b"5") == 5
