"""agent_state as a tool sees it. Letta's script gives a tool Letta's own
pydantic AgentState; where the venv has letta, so does the runner
(AgentState.model_validate of the JSON the engine sent). Otherwise the tool
gets the stand-in below: Letta's tool-facing API over the same JSON, written
from letta/schemas/{agent,memory,block}.py. What it keeps of pydantic:
fields are attributes (reading a name that is no field is an
AttributeError, setting one a ValueError), a model is not subscriptable
(agent_state["id"] is a TypeError, as in Letta), iterating yields
(name, value) pairs, model_dump()/model_dump_json() give the JSON back. Field
values are not re-validated on assignment, except a Block's value, which
must be a string and loses NUL characters as in Letta. Memory.compile()
(prompt rendering) is not offered.

Imported by the tool's process only when its function declares agent_state,
warm or cold (a warm sandbox does not load it ahead: most of its runs would
not use it)."""

import json

from . import ENTRY
from .tool import _jsonable


class ValidationError(ValueError):
    """What the stand-in raises where pydantic raises its ValidationError."""


class _Model:
    _nested = {}  # field -> (model class, holds a list of them)
    _defaults = None  # fields a model built by the tool starts with (Block)

    def __init__(self, **fields):
        if self._defaults is not None:
            fields = dict(self._defaults(), **fields)
        object.__setattr__(self, "_fields", {})
        for k, v in fields.items():
            self._fields[k] = self._wrap(k, v)

    @classmethod
    def model_validate(cls, data):
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValidationError("%s expects an object, got %s" % (cls.__name__, type(data).__name__))
        return cls(**data)

    def _wrap(self, name, value):
        nested = self._nested.get(name)
        if nested is None:
            return value
        kind, many = nested
        if many and isinstance(value, list):
            return [kind.model_validate(v) if isinstance(v, dict) else v for v in value]
        if not many and isinstance(value, dict):
            return kind.model_validate(value)
        return value

    def __getattr__(self, name):
        fields = self.__dict__.get("_fields")
        if fields is not None and name in fields and not name.startswith("__"):
            return fields[name]
        raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))

    def __setattr__(self, name, value):
        if name not in self._fields:
            raise ValueError('"%s" object has no field "%s"' % (type(self).__name__, name))
        self._fields[name] = self._wrap(name, value)

    def __iter__(self):
        return iter(list(self._fields.items()))

    def __eq__(self, other):
        return type(other) is type(self) and other._fields == self._fields

    __hash__ = None

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in self._fields.items()))

    def __str__(self):
        return " ".join("%s=%r" % kv for kv in self._fields.items())

    def _construct(self, fields):
        copied = type(self).__new__(type(self))
        object.__setattr__(copied, "_fields", fields)
        return copied

    def __copy__(self):
        return self._construct(dict(self._fields))

    def __deepcopy__(self, memo):
        import copy

        return self._construct(copy.deepcopy(self._fields, memo))

    def model_dump(self, mode="python", include=None, exclude=None, exclude_none=False, **_):
        out = {}
        for k, v in self._fields.items():
            if (include is not None and k not in include) or (exclude is not None and k in exclude):
                continue
            if exclude_none and v is None:
                continue
            out[k] = _dump_value(v, mode, exclude_none)
        return out

    def model_dump_json(self, **kw):
        return json.dumps(self.model_dump(mode="json", **kw), ensure_ascii=False, default=str)

    def model_copy(self, update=None, deep=False):
        import copy

        copied = copy.deepcopy(self) if deep else copy.copy(self)
        for k, v in (update or {}).items():
            copied._fields[k] = copied._wrap(k, v)
        return copied


def _dump_value(v, mode, exclude_none):
    if isinstance(v, _Model):
        return v.model_dump(mode=mode, exclude_none=exclude_none)
    if isinstance(v, (list, tuple)):
        return [_dump_value(x, mode, exclude_none) for x in v]
    if isinstance(v, dict):
        return {k: _dump_value(x, mode, exclude_none) for k, x in v.items()}
    if mode == "json" and not (v is None or isinstance(v, (str, int, float, bool))):
        return _jsonable(v, 0, set())
    return v


class Block(_Model):
    def __init__(self, **fields):
        # value is required and validated, as in Letta's model.
        if "value" not in fields:
            raise ValidationError("1 validation error for Block\nvalue\n  Field required")
        super().__init__(**fields)
        self.value = fields["value"]

    @staticmethod
    def _defaults():
        import uuid

        # Letta's Block fields and defaults (CORE_MEMORY_BLOCK_CHAR_LIMIT).
        # "value" (required) first, where Letta's model has it.
        return {"value": None, "limit": 100000, "project_id": None, "template_name": None, "is_template": False,
                "template_id": None, "base_template_id": None, "deployment_id": None, "entity_id": None,
                "preserve_on_migration": False, "label": None, "read_only": False, "description": None,
                "metadata": {}, "hidden": None, "id": "block-%s" % uuid.uuid4(), "created_by_id": None,
                "last_updated_by_id": None, "tags": []}

    @classmethod
    def model_validate(cls, data):
        if isinstance(data, dict):
            if "value" not in data:
                raise ValidationError("1 validation error for Block\nvalue\n  Field required")
            block = cls.__new__(cls)
            object.__setattr__(block, "_fields", dict(data))
            block.value = data["value"]
            return block
        return super().model_validate(data)

    def __setattr__(self, name, value):
        if name == "value":
            if not isinstance(value, str):
                raise ValidationError("1 validation error for Block\nvalue\n  Input should be a valid string")
            value = value.replace("\x00", "")
        super().__setattr__(name, value)


class Memory(_Model):
    _nested = {"blocks": (Block, True), "file_blocks": (Block, True)}

    def list_block_labels(self):
        return [block.label for block in self.blocks]

    def get_block(self, label):
        keys = []
        for block in self.blocks:
            if block.label == label:
                return block
            keys.append(block.label)
        raise KeyError(f"Block field {label} does not exist (available sections = {', '.join(keys)})")

    def get_blocks(self):
        return self.blocks

    def set_block(self, block):
        for i, b in enumerate(self.blocks):
            if b.label == block.label:
                self.blocks[i] = block
                return
        self.blocks.append(block)

    def update_block_value(self, label, value):
        if not isinstance(value, str):
            raise ValueError("Provided value must be a string")
        for block in self.blocks:
            if block.label == label:
                block.value = value
                return
        raise ValueError(f"Block with label {label} does not exist")


def _submodel(name):
    return type(name, (_Model,), {"__module__": ENTRY})


class AgentState(_Model):
    _nested = {
        "memory": (Memory, False),
        "blocks": (Block, True),
        "llm_config": (_submodel("LLMConfig"), False),
        "embedding_config": (_submodel("EmbeddingConfig"), False),
        "tools": (_submodel("Tool"), True),
        "sources": (_submodel("Source"), True),
        "secrets": (_submodel("AgentEnvironmentVariable"), True),
        "tool_exec_environment_variables": (_submodel("AgentEnvironmentVariable"), True),
        "identities": (_submodel("Identity"), True),
        "managed_group": (_submodel("Group"), False),
        "multi_agent_group": (_submodel("Group"), False),
    }

    def get_agent_env_vars_as_dict(self):
        return {v.key: v.value or "" for v in self._fields.get("secrets") or []}


# The module type() of a stand-in shows, and a traceback's last line
# ("toolsandbox_runner.ValidationError: ..."): the runner's, as when it was
# one module (ENTRY in __init__.py).
for _cls in (ValidationError, _Model, Block, Memory, AgentState):
    _cls.__module__ = ENTRY
del _cls


def _agent_state_for_tool(data, namespace):
    """agent_state as the tool receives it: Letta's AgentState when letta's
    schemas import in the venv (then, as Letta's script does, `from letta
    import *` fills the tool's namespace), else the stand-in (whose
    AgentState, Memory and Block are then predefined)."""
    if data is None:
        return None
    try:
        exec("import letta\nfrom letta import *", namespace)
        from letta.schemas.agent import AgentState as LettaAgentState

        return LettaAgentState.model_validate(data)
    except Exception:
        pass
    namespace.update(AgentState=AgentState, Memory=Memory, Block=Block)
    return AgentState.model_validate(data)


def _agent_state_back(state):
    """The agent state the run returns, as Letta's script makes it:
    agent_state.model_dump(mode="json"), None when that fails."""
    if state is None:
        return None
    try:
        dumped = state.model_dump(mode="json")
        return _jsonable(dumped, 0, set()) if isinstance(dumped, dict) else None
    except Exception:
        return None
