"""peerwire's SBS schemas, read as package resources, loaded into one hat-sbs repository.

The ``.sbs`` files ship inside the ``wire`` package as ``wire.schemas_sbs`` (built from the
source tree's ``schemas_sbs/`` folder). They are read with :mod:`importlib.resources`, so they
load wherever ``wire`` itself imports from: a venv, ``pip install --user`` or ``--target``, an
editable install, or a zip on ``sys.path`` (Spark ``--py-files``, Spark Connect artifacts).

:func:`check` walks a peer's bytes against a type before hat-sbs decodes them, which hat-sbs
does at a cost the bytes do not bound (an Array allocated from its count, recursion).
"""

from __future__ import annotations

import functools
import importlib.resources
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from wire import sbs
from wire.errors import MalformedMessage

if TYPE_CHECKING:
    import hat.sbs

PACKAGE = "wire.schemas_sbs"
"""The package whose resources are the ``.sbs`` files."""

MODULES = ("Hat", "HatChatter", "HatEventer", "HatPing", "PeerwireRpc")
"""The SBS modules peerwire needs: every one must be installed."""

SBS_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    SystemError,
    struct.error,
    MemoryError,
    RecursionError,
)
"""What hat-sbs raises on bytes or values that do not fit the type it is asked to decode or
encode (its C decoder raises SystemError on some truncated input, its Python one
struct.error; MemoryError for an Array count past memory, RecursionError for deep nesting,
which :func:`check` refuses first): catch these, not ``Exception``, around
``Repository.decode``/``encode``."""


class SchemaNotFound(LookupError):
    """One of peerwire's ``.sbs`` schemas is not installed (a broken or partial install)."""


def schema_texts() -> dict[str, str]:
    """Module name -> schema text, for every module in :data:`MODULES`.

    Raises :class:`SchemaNotFound` naming the missing module and where it was looked for.
    """
    try:
        folder = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError as exc:
        raise SchemaNotFound(
            f"peerwire's SBS schemas are not installed: no package {PACKAGE} "
            f"({exc}); reinstall peerwire (`pip install --force-reinstall peerwire`)"
        ) from None
    texts: dict[str, str] = {}
    for module in MODULES:
        resource = folder / f"{module}.sbs"
        try:
            texts[module] = resource.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            raise SchemaNotFound(
                f"peerwire's SBS schema {module}.sbs is missing from {PACKAGE} ({folder}); "
                "reinstall peerwire (`pip install --force-reinstall peerwire`)"
            ) from None
    return texts


@functools.cache
def repository(*extra: Path | str) -> hat.sbs.Repository:
    """One :class:`hat.sbs.Repository` of every peerwire schema, plus ``extra`` ones.

    ``extra`` items are schema texts, ``.sbs`` files or folders, as hat-sbs accepts them;
    the result is cached per argument tuple because parsing schemas takes milliseconds.
    Raises :class:`SchemaNotFound` when a schema is not installed.
    """
    import hat.sbs  # here, not at the top: its import is a third of ``import rpc``'s time

    return hat.sbs.Repository(*schema_texts().values(), *extra)


# --- checking bytes before hat-sbs decodes them -----------------------------------------------

MAX_SBS_DEPTH = 64
"""Deepest nesting of Arrays, Records and Choices (an Optional is a Choice) that
:func:`check` lets through (default 64): hat-sbs' C decoder recurses once a level and
crashes the process near 100,000 levels, which a recursive schema (``T = Array(T)``) lets a
peer send."""


class SbsRejected(ValueError):
    """Bytes :func:`check` refuses: decoding them would cost far more than their size."""


_Check: TypeAlias = Callable[[bytes, int, int, list[int]], int]
"""``(data, pos, depth, budget) -> next pos``: one type's bytes checked from ``pos``."""


def check(repo: hat.sbs.Repository, name: str, data: bytes) -> None:
    """Raise :class:`SbsRejected` unless ``repo.decode(name, data)`` costs time and memory
    in proportion to ``len(data)``. hat-sbs allocates an Array from its count before
    reading an element, and recurses without a limit; this walks the bytes first (about
    1.2-1.7x the time hat-sbs takes to decode them, allocating nothing):

    - an Array's count is at most the bytes left, for elements that take bytes; elements
      that take none (``None``, Records of them) count against a budget of ``len(data) + 1``
      per payload;
    - a String's or Bytes' length fits in the bytes left; an Integer is at most 10 bytes
      and within int64; a Choice's (an Optional's) index names one of its entries;
    - nesting is at most :data:`MAX_SBS_DEPTH` deep.

    What this lets through may still fail in hat-sbs (bad UTF-8): see :data:`SBS_ERRORS`.
    KeyError for a ``name`` the repository does not define.
    """
    budget = [len(data) + 1]
    try:
        _checks(repo).get(name)(data, 0, 0, budget)
    except IndexError:
        raise SbsRejected("truncated") from None
    except MalformedMessage as exc:
        raise SbsRejected(str(exc)) from None


class _Node:
    """One type of a repository, resolved: a builtin ``kind``, or ``Ref`` to a named one."""

    __slots__ = ("items", "kind")

    def __init__(self, kind: str, items: list[_Node]) -> None:
        self.kind = kind
        self.items = items  # Array: [element]; Record, Choice: the entries; Ref: [target]


_LEAVES = frozenset(("None", "Boolean", "Integer", "Float", "String", "Bytes"))


class _Checks:
    """The :data:`_Check` of every type name of one repository, built on first use from
    the repository's JSON form (its schemas as data), as hat-sbs' evaluator reads them."""

    def __init__(self, repo: hat.sbs.Repository) -> None:
        self._defs: dict[tuple[str, str], Any] = {
            (module["name"], type_name): type_def
            for module in repo.to_json()
            for type_name, type_def in module["type_defs"].items()
        }
        self._named: dict[tuple[str, str], _Node] = {}
        self._built: dict[int, _Check] = {}
        self._cells: dict[int, list[_Check]] = {}
        self._by_name: dict[str, _Check] = {}

    def get(self, name: str) -> _Check:
        """KeyError for a name the repository does not define."""
        fn = self._by_name.get(name)
        if fn is None:
            module, _, type_name = name.rpartition(".")
            fn = self._by_name[name] = self._build(self._ref((module, type_name)))
        return fn

    # -- schema data to nodes (Refs kept, so a recursive type is a cycle) --

    def _ref(self, key: tuple[str, str]) -> _Node:
        node = self._named.get(key)
        if node is None:
            type_def = self._defs[key]
            if type_def["args"]:
                raise KeyError(f"{key[0]}.{key[1]} takes arguments")
            node = self._named[key] = _Node("Ref", [])
            node.items.append(self._resolve(key[0], type_def["type"], {}))
        return node

    def _resolve(self, module: str, ast: Any, args: dict[str, _Node]) -> _Node:
        name, params = ast["name"], ast["args"]
        if ast["module"] is None:
            if name in args and not params:
                return args[name]
            if name in _LEAVES:
                return _Node(name, [])
            if name == "Optional":
                return _Node("Choice", [_Node("None", []), self._resolve(module, params[0], args)])
            if name == "Array":
                return _Node("Array", [self._resolve(module, params[0], args)])
            if name in ("Record", "Choice"):
                return _Node(name, [self._resolve(module, e["type"], args) for e in ast["entries"]])
        key = (ast["module"] or module, name)
        if not params:
            return self._ref(key)
        type_def = self._defs[key]  # a generic type: its body with the arguments put in
        given = [self._resolve(module, param, args) for param in params]
        return self._resolve(
            key[0], type_def["type"], dict(zip(type_def["args"], given, strict=True))
        )

    # -- nodes to checks --

    def _build(self, node: _Node) -> _Check:
        seen = 0
        while node.kind == "Ref":  # an alias of an alias...: follow, refusing a loop
            node, seen = node.items[0], seen + 1
            if seen > len(self._named):
                return _loop
        built = self._built.get(id(node))
        if built is not None:
            return built
        if id(node) in self._cells:  # a recursive type, still being built: through its cell
            return _late(self._cells[id(node)])
        if node.kind in _LEAVES:
            built = _LEAF_CHECKS[node.kind]
        else:
            cell = self._cells[id(node)] = [_loop]
            items = [self._build(item) for item in node.items]
            if node.kind == "Array":
                built = _array(items[0], _takes_no_bytes(node.items[0], set()))
            elif node.kind == "Record":
                built = _record(items)
            else:
                built = _choice(items)
            cell[0] = built
            del self._cells[id(node)]
        self._built[id(node)] = built
        return built


def _late(cell: list[_Check]) -> _Check:
    """The check ``cell`` will hold once built."""
    return lambda data, pos, depth, budget: cell[0](data, pos, depth, budget)


def _takes_no_bytes(node: _Node, seen: set[int]) -> bool:
    """None, and Records of nothing else, take no bytes (a loop of Records never ends:
    :func:`check` refuses it at its depth limit, so say it takes bytes)."""
    while node.kind == "Ref":
        if id(node) in seen:
            return False
        seen.add(id(node))
        node = node.items[0]
    if node.kind == "Record":  # each entry on its own path: a type used twice is no loop
        return all(_takes_no_bytes(item, set(seen)) for item in node.items)
    return node.kind == "None"


def _loop(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    raise SbsRejected("the type is an alias of itself")


def _none(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    return pos


def _one_byte(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    if pos >= len(data):
        raise IndexError
    return pos + 1


def _float(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    if pos + 8 > len(data):
        raise IndexError
    return pos + 8


def _integer(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    if data[pos] & 0x80:
        return pos + 1
    return sbs.read_integer(data, pos)[1]


def _sized(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
    size = data[pos]
    if size & 0xC0 == 0x80:  # a length under 64 in one byte: the common case
        pos += 1 + (size & 0x3F)
        if pos > len(data):
            raise IndexError
        return pos
    size, pos = sbs.read_integer(data, pos)
    if not 0 <= size <= len(data) - pos:
        raise SbsRejected(f"a String or Bytes of {size} bytes, {len(data) - pos} left")
    return pos + size


_LEAF_CHECKS: dict[str, _Check] = {
    "None": _none,
    "Boolean": _one_byte,
    "Integer": _integer,
    "Float": _float,
    "String": _sized,
    "Bytes": _sized,
}


def _too_deep() -> SbsRejected:
    return SbsRejected(f"nested more than {MAX_SBS_DEPTH} deep")


def _array(element: _Check, no_bytes: bool) -> _Check:
    def check_array(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
        if depth >= MAX_SBS_DEPTH:
            raise _too_deep()
        count, pos = sbs.read_integer(data, pos)
        if count < 0:
            raise SbsRejected(f"an Array of {count} elements")
        if no_bytes:  # all alike and none reads a byte: check one, count them all
            budget[0] -= count
            if budget[0] < 0:
                raise SbsRejected(f"more elements that take no bytes than {len(data) + 1}")
            return element(data, pos, depth + 1, budget) if count else pos
        if count > len(data) - pos:
            raise SbsRejected(f"an Array of {count} elements, {len(data) - pos} bytes left")
        depth += 1
        for _ in range(count):
            pos = element(data, pos, depth, budget)
        return pos

    return check_array


def _record(entries: list[_Check]) -> _Check:
    def check_record(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
        if depth >= MAX_SBS_DEPTH:
            raise _too_deep()
        depth += 1
        for entry in entries:
            pos = entry(data, pos, depth, budget)
        return pos

    return check_record


def _choice(entries: list[_Check]) -> _Check:
    def check_choice(data: bytes, pos: int, depth: int, budget: list[int]) -> int:
        if depth >= MAX_SBS_DEPTH:
            raise _too_deep()
        index = data[pos]
        if index & 0xC0 == 0x80:  # one byte, not negative: the common case
            index, pos = index & 0x3F, pos + 1
        else:
            index, pos = sbs.read_integer(data, pos)
        if not 0 <= index < len(entries):
            raise SbsRejected(f"Choice entry {index} of {len(entries)}")
        return entries[index](data, pos, depth + 1, budget)

    return check_choice


@functools.lru_cache(maxsize=32)
def _checks(repo: hat.sbs.Repository) -> _Checks:
    """One :class:`_Checks` per repository (a repository hashes by identity and does not
    change), its checks built as types are first checked."""
    return _Checks(repo)
