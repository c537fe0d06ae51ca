"""Function tools on the client side: plain Python functions the model may call.

    tools = Toolbox()

    @tools.function
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
        '''Current weather of a city.'''
        ...

``Toolbox.session_tools()`` gives the ``session.tools`` list (the JSON Schema of each function's
parameters from its type hints, its description from the docstring's first paragraph, unless
given); ``await toolbox.run(call)`` runs the function a ``function_call`` item names with its JSON
arguments and gives the output text (the return value as JSON, or ``{"error": …}``: a failing
function or bad arguments are told to the model, not raised). ``load_tools(path)`` reads the
public functions of a Python file (``voxloop ptt --tools FILE.py``).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from base.errors import InvalidInput

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def schema_of(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a type hint: str/int/float/bool/dict/list, ``list[X]``, ``Literal[...]``,
    ``X | None``. Raises InvalidInput for a hint it cannot describe."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        values = typing.get_args(tp)
        return {"type": _JSON_TYPES[type(values[0])], "enum": list(values)}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return schema_of(options[0])
        return {"anyOf": [schema_of(a) for a in options]}
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return {"type": "array", **({"items": schema_of(args[0])} if args else {})}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    raise InvalidInput(f"no JSON Schema for the type {tp!r}: use str, int, float, bool, list, dict or Literal")


@dataclass(frozen=True)
class CallResult:
    """A call a reply made and the output sent back."""

    call_id: str
    name: str
    arguments: str  # JSON text
    output: str


@dataclass(frozen=True)
class Tool:
    """A function and how the model sees it."""

    function: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def of(cls, function: Callable[..., Any], name: str | None = None, description: str | None = None,
           parameters: dict[str, Any] | None = None) -> Tool:
        doc = inspect.getdoc(function) or ""
        return cls(function, name or function.__name__, description or doc.split("\n\n")[0].strip(),
                   parameters or parameters_of(function))

    def session_tool(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters}


def parameters_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The JSON Schema of ``function``'s parameters: required unless they have a default."""
    hints = typing.get_type_hints(function)
    properties, required = {}, []
    for name, p in inspect.signature(function).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        properties[name] = schema_of(hints.get(name, str))
        if p.default is p.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


class Toolbox:
    """The functions a client offers, by name (module doc)."""

    def __init__(self, functions: list[Callable[..., Any]] = ()) -> None:
        self.tools: dict[str, Tool] = {}
        for f in functions:
            self.function(f)

    def function(self, function: Callable[..., Any] | None = None, *, name: str | None = None,
                 description: str | None = None, parameters: dict[str, Any] | None = None) -> Any:
        """Register ``function`` (usable as ``@toolbox.function`` or ``@toolbox.function(name=…)``)."""
        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            tool = Tool.of(f, name, description, parameters)
            self.tools[tool.name] = tool
            return f

        return register if function is None else register(function)

    def session_tools(self) -> list[dict[str, Any]]:
        return [t.session_tool() for t in self.tools.values()]

    async def run(self, name: str, arguments: str) -> str:
        """The output of the call ``name(**arguments)`` as text (module doc)."""
        tool = self.tools.get(name)
        if tool is None:
            return json.dumps({"error": f"no function named {name!r}"})
        try:
            kwargs = json.loads(arguments or "{}")
            if not isinstance(kwargs, dict):
                raise ValueError("the arguments are not a JSON object")
            result = tool.function(**kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - the model hears what went wrong
            return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        return result if isinstance(result, str) else json.dumps(result, default=str, ensure_ascii=False)


def load_tools(path: str | Path) -> Toolbox:
    """A toolbox of the public functions defined in the Python file ``path`` (those listed in its
    ``TOOLS``, if it has one)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"voxloop_tools_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise InvalidInput(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions = getattr(module, "TOOLS", None) or [
        f for n, f in vars(module).items()
        if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__]
    if not functions:
        raise InvalidInput(f"{path}: no public functions to offer as tools")
    return Toolbox(functions)
