"""Parsing tool calls out of model text.

Two formats are accepted, and may be mixed within one turn (calls run in textual order):

**Tagged** (short and regular enough for small models to learn)::

    <bash>COMMAND</bash>                                     shell command (/bin/sh -c) in the workspace
    <python>CODE</python>                                    Python code in the workspace
    <read path="PATH"/>                                      read a workspace file
    <write path="PATH">CONTENT</write>                       create or overwrite a file
    <edit path="PATH"><old>TEXT</old><new>TEXT</new></edit>  replace exactly one occurrence
    <tool name="NAME">ARGS</tool>                            a domain tool
    <submit>ANSWER</submit>                                  end the episode with ANSWER (may be empty)

A body runs to the first matching closing tag (so a body cannot contain its own closing tag). A
tag left open at the very end of the text is closed there: policies usually stop generating at a
closing tag, which stop strings cut off.

**OpenAI-style function calls**: a JSON object ``{"name": "bash", "arguments": {"command": "ls"}}``
(``arguments`` may also be a JSON-encoded string), alone, in a ``<tool_call>...</tool_call>``
wrapper (Hermes/Qwen style), or a JSON list of them. Tool names: ``bash(command)``,
``python(code)``, ``read_file(path)``, ``write_file(path, content)``,
``edit_file(path, old, new)``, ``submit(answer)``, and the domain tools (``arguments`` is passed to
them as JSON text, or as the ``input`` string when that is the only field).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Canonical tool names; the tagged spelling on the left maps to the name on the right.
_TAG_NAMES = {"bash": "bash", "python": "python", "read": "read_file", "write": "write_file",
              "edit": "edit_file", "submit": "submit"}
BUILTIN_TOOLS = ("bash", "python", "read_file", "write_file", "edit_file", "submit")
_REQUIRED_ARGS = {"bash": ("command",), "python": ("code",), "read_file": ("path",),
                  "write_file": ("path", "content"), "edit_file": ("path", "old", "new"),
                  "submit": ()}

_ATTR = r'\s+{0}\s*=\s*"([^"]*)"'
_OPENERS = re.compile(
    r"<(?P<simple>bash|python|submit)>"
    r"|<read" + _ATTR.format("path") + r"\s*/?>"
    r"|<write" + _ATTR.format("path") + r"\s*>"
    r"|<edit" + _ATTR.format("path") + r"\s*>"
    r"|<tool" + _ATTR.format("name") + r"\s*>"
    r"|<tool_call>"
    r'|(?P<json>\[?\s*\{\s*"(?:name|function|type)")'
)
_EDIT_BODY = re.compile(r"\s*<old>(.*?)</old>\s*<new>(.*?)(?:</new>\s*|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    unclosed: bool = False
    """the call's closing tag was missing (closed at the end of the text)"""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args, "unclosed": self.unclosed}


@dataclass
class ParsedAction:
    calls: list[ToolCall]
    errors: list[str]
    """what could not be parsed (shown to the policy, counted as parse errors)"""


def _body(text: str, start: int, closer: str) -> tuple[str, int, bool]:
    """Text from `start` to the first `closer`; (body, end index, unclosed)."""
    end = text.find(closer, start)
    if end < 0:
        return text[start:], len(text), True
    return text[start:end], end + len(closer), False


def _from_json_obj(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError("a function call must be a JSON object")
    if "function" in obj and isinstance(obj["function"], dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError('a function call needs a string "name"')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments of {name!r} are not valid JSON: {e.msg}") from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments of {name!r} must be a JSON object")
    # Accept the tagged names as function names too (read -> read_file, ...).
    return ToolCall(_TAG_NAMES.get(name, name) if name in ("read", "write", "edit") else name, args)


def _parse_json_at(text: str, start: int) -> tuple[list[ToolCall], int]:
    obj, end = json.JSONDecoder().raw_decode(text, start)
    objs = obj if isinstance(obj, list) else [obj]
    return [_from_json_obj(o) for o in objs], end


def parse_action(text: str) -> ParsedAction:
    """All tool calls in `text`, in order, plus the errors of malformed ones."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while True:
        m = _OPENERS.search(text, pos)
        if m is None:
            break
        tag = m.group(0)
        try:
            if m.group("simple"):
                name = m.group("simple")
                body, pos, unclosed = _body(text, m.end(), f"</{name}>")
                key = {"bash": "command", "python": "code", "submit": "answer"}[name]
                calls.append(ToolCall(_TAG_NAMES[name], {key: body}, unclosed))
            elif tag.startswith("<read"):
                pos = m.end()
                if not tag.endswith("/>") and text.startswith("</read>", pos):
                    pos += len("</read>")
                calls.append(ToolCall("read_file", {"path": m.group(2)}))
            elif tag.startswith("<write"):
                body, pos, unclosed = _body(text, m.end(), "</write>")
                calls.append(ToolCall("write_file", {"path": m.group(3), "content": body}, unclosed))
            elif tag.startswith("<edit"):
                body, pos, unclosed = _body(text, m.end(), "</edit>")
                em = _EDIT_BODY.match(body)
                if em is None:
                    raise ValueError("<edit> needs <old>TEXT</old><new>TEXT</new> inside")
                calls.append(ToolCall("edit_file", {"path": m.group(4), "old": em.group(1),
                                                    "new": em.group(2)}, unclosed))
            elif tag.startswith("<tool_call>"):
                body, pos, unclosed = _body(text, m.end(), "</tool_call>")
                inner = body.strip()
                found, _ = _parse_json_at(inner, 0)
                calls.extend(found)
            elif tag.startswith("<tool"):
                body, pos, unclosed = _body(text, m.end(), "</tool>")
                calls.append(ToolCall(m.group(5), {"input": body}, unclosed))
            else:  # bare JSON
                found, pos = _parse_json_at(text, m.start())
                calls.extend(found)
        except json.JSONDecodeError as e:
            errors.append(f"could not parse the function call at character {m.start()}: {e.msg}")
            pos = m.end()
        except ValueError as e:
            errors.append(str(e))
            pos = max(pos, m.end())
    return ParsedAction(calls, errors)


def check_args(call: ToolCall) -> str | None:
    """None if a built-in call has its required string arguments, else what is wrong."""
    for key in _REQUIRED_ARGS.get(call.name, ()):
        if not isinstance(call.args.get(key), str):
            return f"tool {call.name!r} needs a string argument {key!r}"
    return None
