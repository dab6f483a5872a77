"""The child that decodes a pickle payload into plain data.

Scripts Letta generated before it switched to JSON (the seed's
ToolExecutionSandbox, and its asyncio sandbox until PR #3343) end with
base64(pickle.dumps({"results": value, "agent_state": agent_state})), which
letta-server pickle.loads-ed: code execution in the server for any tool
that prints such a frame. Here the payload is decoded in the run's own
sandbox, by an unpickler whose find_class never hands out a class or a
function of the payload's choosing: a few value types are rebuilt (_values()),
every other global becomes a _Stub class that only records what the pickle
gives it (constructor arguments, state, items). Stubs then become plain
data: a model or any object with a __dict__ state becomes a dict of its
fields (a pydantic model: its __dict__, plus __pydantic_extra__), an object
built from one argument (an enum member) that argument. results then
becomes JSON as Letta's JSON script turns a result into it (_jsonable), and
agent_state as AgentState.model_dump(mode="json") would (datetimes in
ISO 8601, sets as lists), for the daemon's client to revalidate. Where the
JSON of results stands for a tuple, a set, a frozenset, bytes, a bytearray
or a dict key that was not a string, "types" says so (_types; the
daemon's record.pickle_types, PROTOCOL.md 13.1), so that a client can
rebuild the values letta-server's pickle.loads gave it.

Imported only for an unpickle request, warm or cold."""

from .base import _ExactIntegers, _error_line, _error_payload, _safe_str
from .tool import _MAX_RESULT_DEPTH, _json_key, _jsonable, _payload_bytes, _serialize_result


class _Stub:
    """An instance of a class the payload named; records, never runs, anything."""

    _module = _qualname = ""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        object.__setattr__(obj, "_args", args)
        object.__setattr__(obj, "_kwargs", kwargs)
        object.__setattr__(obj, "_state", None)
        object.__setattr__(obj, "_items", [])
        object.__setattr__(obj, "_mapping", [])
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __repr__(self):
        return "<%s.%s object>" % (self._module, self._qualname)

    def __setstate__(self, state):
        object.__setattr__(self, "_state", state)

    def __setitem__(self, key, value):
        self._mapping.append((key, value))

    def append(self, value):
        self._items.append(value)

    def extend(self, values):
        self._items.extend(values)


def _stub_class(module, qualname):
    return type("_Stub", (_Stub,), {"_module": module, "_qualname": qualname})


def _reconstructor(cls, base, state):
    # copyreg._reconstructor, which protocols 0 and 1 name for objects: an
    # object of a str, int, list ... subclass carries its value as `state`.
    if isinstance(cls, type) and issubclass(cls, _Stub):
        return cls.__new__(cls) if state is None else cls.__new__(cls, state)
    import uuid

    if cls is uuid.UUID and state is None:  # then its __setstate__, from the BUILD
        return object.__new__(uuid.UUID)
    import pickle

    raise pickle.UnpicklingError("cannot rebuild %r from %r" % (cls, base))


def _latin1_encode(text, encoding="utf-8"):
    # _codecs.encode, which protocols 0 to 2 name for bytes objects.
    import pickle

    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("unexpected bytes encoding in the payload")
    return text.encode("latin1")


def _tz_info(seconds):
    # pydantic_core's TzInfo (the zone of a datetime pydantic parsed).
    import datetime

    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return datetime.timezone(datetime.timedelta(seconds=seconds))
    import pickle

    raise pickle.UnpicklingError("bad TzInfo state")


def _ordered_dict(items=()):
    # collections.OrderedDict, as a plain dict: an OrderedDict instance has a
    # __dict__ that the pickle's BUILD could fill.
    return dict(items)


def _values():
    """What find_class hands out for these names: immutable builtin types,
    whose instances have no __dict__ a BUILD could fill, and functions of
    ours, each wrapped anew (a BUILD that sets attributes on one changes
    nothing anything reads)."""
    import datetime
    import decimal
    import uuid

    def fresh(fn):
        return lambda *args: fn(*args)

    return {
        ("builtins", "set"): lambda: set, ("builtins", "frozenset"): lambda: frozenset,
        ("builtins", "bytearray"): lambda: bytearray, ("builtins", "complex"): lambda: complex,
        ("datetime", "datetime"): lambda: datetime.datetime, ("datetime", "date"): lambda: datetime.date,
        ("datetime", "time"): lambda: datetime.time, ("datetime", "timedelta"): lambda: datetime.timedelta,
        ("datetime", "timezone"): lambda: datetime.timezone, ("decimal", "Decimal"): lambda: decimal.Decimal,
        ("uuid", "UUID"): lambda: uuid.UUID,
        ("collections", "OrderedDict"): lambda: fresh(_ordered_dict),
        ("copyreg", "_reconstructor"): lambda: fresh(_reconstructor),
        ("_codecs", "encode"): lambda: fresh(_latin1_encode),
        ("pydantic_core._pydantic_core", "TzInfo"): lambda: fresh(_tz_info),
    }


_MAX_DECODED_VALUES = 1 << 18  # what a pickle's shared references may expand to


class _TooLarge(Exception):
    pass


def _plain(obj, json_mode, depth, active, budget):
    """obj with every stub replaced by plain data; in json_mode also every
    other non-JSON value, as pydantic's mode="json" writes it. budget: a
    one-element list counting down the values produced (shared references
    are copied, so a small pickle can name a huge tree)."""
    import datetime
    import decimal
    import uuid

    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge("the payload expands to more than %d values" % _MAX_DECODED_VALUES)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if depth > _MAX_RESULT_DEPTH:
        raise ValueError("the payload is nested deeper than %d levels" % _MAX_RESULT_DEPTH)
    if isinstance(obj, type):
        if issubclass(obj, _Stub):
            return "<class '%s.%s'>" % (obj._module, obj._qualname)
        return str(obj)
    if id(obj) in active:
        raise ValueError("Circular reference detected")
    active.add(id(obj))
    try:
        def sub(v):
            return _plain(v, json_mode, depth + 1, active, budget)

        def key(k):
            # A stub is no key json.dumps takes, and its plain form may not
            # be hashable; in json_mode every key becomes a string as
            # json.dumps writes it (a tuple's str()).
            if isinstance(k, _Stub):
                return _safe_str(sub(k))
            return _json_key(k) if json_mode else k

        if isinstance(obj, _Stub):
            state = obj._state
            if isinstance(state, tuple) and len(state) == 2 and all(x is None or isinstance(x, dict) for x in state):
                merged = dict(state[0] or {})  # (state, slotstate)
                merged.update(state[1] or {})
                state = merged
            if isinstance(state, dict):
                fields = state
                if isinstance(state.get("__dict__"), dict):  # a pydantic model
                    fields = dict(state["__dict__"])
                    if isinstance(state.get("__pydantic_extra__"), dict):
                        fields.update(state["__pydantic_extra__"])
                out = {k: sub(v) for k, v in fields.items()}
                out.update((key(k), sub(v)) for k, v in obj._mapping)
                return out
            if obj._mapping:
                return {key(k): sub(v) for k, v in obj._mapping}
            if obj._items:
                return [sub(v) for v in obj._items]
            if state is None and len(obj._args) == 1 and not obj._kwargs:
                return sub(obj._args[0])  # an enum member, a str or int subclass
            return "<%s.%s object>" % (obj._module, obj._qualname)
        if isinstance(obj, dict):
            return {key(k): sub(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [sub(v) for v in obj]
            # A tuple stays one outside json_mode, for _types to name.
            return tuple(items) if isinstance(obj, tuple) and not json_mode else items
        if not json_mode:
            return obj  # a set, a datetime, ...: str() of it, as Letta's script writes it (_jsonable)
        if isinstance(obj, (set, frozenset)):
            return [sub(v) for v in obj]
        if isinstance(obj, datetime.datetime):
            text = obj.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(obj, (datetime.date, datetime.time)):
            return obj.isoformat()
        if isinstance(obj, (bytes, bytearray)):
            return bytes(obj).decode("utf-8", "replace")
        if isinstance(obj, (decimal.Decimal, complex, datetime.timedelta, uuid.UUID)):
            return str(obj)
        return _safe_str(obj)
    finally:
        active.discard(id(obj))


_MAX_TYPE_ENTRIES = 1 << 16  # entries of "types", nested ones included


class _TooManyTypes(Exception):
    pass


def _key_type(k):
    # The key types json.dumps writes as strings and a client can read back.
    if isinstance(k, str):
        return None
    if k is True or k is False:
        return "bool"
    if k is None:
        return "none"
    if isinstance(k, int):
        return "int"
    if isinstance(k, float):
        return "float"
    return None  # a tuple, frozenset, bytes ... key: its str(), as JSON has it


def _annotate(obj, path, out, budget):
    """Appends to out an entry for each value under obj whose JSON (as
    _jsonable writes it) stands for another type: [path, "tuple"],
    [path, "key", "int"|"float"|"bool"|"none"] (path ends with the member's
    name), [path, "bytes"|"bytearray", base64], [path, "set"|"frozenset",
    JSON text of its items as a list, entries of that list]."""

    def add(entry):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManyTypes()
        out.append(entry)

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return
    if isinstance(obj, (list, tuple)):
        if isinstance(obj, tuple):
            add([path, "tuple"])
        for i, v in enumerate(obj):
            _annotate(v, path + [i], out, budget)
    elif isinstance(obj, dict):
        # As _jsonable's dict: of keys written alike, the last one's value stays.
        members = {}
        for k, v in obj.items():
            members[_json_key(k)] = (k, v)
        for name, (k, v) in members.items():
            kind = _key_type(k)
            if kind:
                add([path + [name], "key", kind])
            _annotate(v, path + [name], out, budget)
    elif isinstance(obj, (set, frozenset)):
        items = list(obj)  # in str()'s order
        inner = []
        _annotate(items, [], inner, budget)
        add([path, "frozenset" if isinstance(obj, frozenset) else "set",
             _payload_bytes(_jsonable(items, 0, set())).decode("ascii"), inner])
    elif isinstance(obj, (bytes, bytearray)):
        import base64

        add([path, "bytearray" if isinstance(obj, bytearray) else "bytes", base64.b64encode(bytes(obj)).decode("ascii")])


def _types(value):
    """The "types" of a decoded result (_annotate's entries, in document
    order): None when there are none, False when there are more than
    _MAX_TYPE_ENTRIES (or they cannot be written), and then none are sent."""
    out = []
    try:
        _annotate(value, [], out, [_MAX_TYPE_ENTRIES])
    except (_TooManyTypes, ValueError, TypeError, RecursionError):
        return False
    return out or None


def _decode_pickle(b64, err_fd):
    import _compat_pickle
    import base64
    import binascii
    import io
    import pickle

    values = _values()
    stubs = {}

    class _PlainUnpickler(pickle.Unpickler):
        def find_class(self, module, name):
            # Python 2 names, which protocols 0 to 2 write (as pickle's own find_class).
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
            if (module, name) in values:
                return values[(module, name)]()
            if (module, name) not in stubs:
                stubs[(module, name)] = _stub_class(module, name)
            return stubs[(module, name)]

    def failed(exc):
        _error_line(err_fd, type(exc).__name__, _safe_str(exc))
        return _error_payload("tool", type(exc).__name__, _safe_str(exc))

    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        return failed(e)
    try:
        with _ExactIntegers():
            value = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # UnpicklingError, EOFError, RecursionError, MemoryError, ...
        return failed(e)
    del data
    try:
        # What letta-server read from it.
        results, agent_state = value["results"], value["agent_state"]
    except Exception as e:
        return failed(e)
    budget = [_MAX_DECODED_VALUES]
    try:
        state = _plain(agent_state, True, 0, set(), budget) if agent_state is not None else None
        if state is not None and not isinstance(state, dict):
            raise TypeError("agent_state is a %s, not an object" % type(agent_state).__name__)
        try:
            plain = _plain(results, False, 0, set(), budget)
        except (ValueError, TypeError, RecursionError):
            plain = results  # a cycle, extreme depth: str() of it, with the warning
    except (_TooLarge, ValueError, TypeError, RecursionError) as e:
        return failed(ValueError(str(e)) if isinstance(e, _TooLarge) else e)
    try:
        results, types = _jsonable(plain, 0, set()), _types(plain)
    except Exception:
        results, types = _serialize_result(plain, err_fd), None  # str() of it, with the warning
    # An empty agent_state is none, as the JSON framings read it.
    msg = {"results": results, "agent_state": state or None}
    if types:
        msg["types"] = types
    elif types is False:
        msg["types_omitted"] = True
    return msg
