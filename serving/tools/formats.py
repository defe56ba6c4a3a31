"""Tool-call harness formats: how offered tools, calls and results are written for a local model.

A `ToolCallFormat` (frozen) fixes everything model-visible about tools, so one object renders training
traces (`posttrain`) and serving prompts and parses the model's replies (`serving.tools.harness` takes it
as `fmt=`):

- `system_template`: the text appended to the system turn. Placeholders: `{tools}` (required: one JSON
  object {"name", "description", "parameters"} per line), `{call_example}` (the call syntax, written by
  the style), `{block}` (the block's name, e.g. "tool_call"), `{parallel_rule}` and `{choice_rule}` (the
  parallel_tool_calls / tool_choice sentences). A line holding only a placeholder that is empty is dropped;
  other braces are literal text.
- `style` "json" or "xml" (`serving.tools.styles`) with the block tags `call_open`/`call_close` around each
  call (style xml only: both empty, and the `<function=...>` element is the block itself), `name_key` /
  `arguments_key` (style json), `nested_values` (style xml: "json" writes object/array values as JSON text,
  "refuse" refuses such parameters up front, for harnesses whose values are only plain text), `fenced_calls`
  (style json: "call" reads a reply that is nothing but one Markdown code block holding a call's JSON as that
  call, as Qwen2.5-Coder writes one unforced; "content", the default, leaves it text).
- `response_template`: one tool result, placeholders `{name}`, `{id}`, `{content}` (required); results go
  back in a user turn (`serving.tools.harness.render_messages`). Its literal ends are the result markers
  (`result_open`, `result_close`): after a tool result, blocks the model writes before its answer are an
  echo it goes on past, `result_open` after answer text stops it (`SamplingParams.echo_markers`), and every
  result block is cut from its answer (`serving.tools.harness.strip_tool_results`).

Built-in formats (`FORMATS`):

    "json" = "default"  <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>
                        (bit-for-bit the first harness format; the only one forced tool_choice can enforce)
    "xml"               <function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n</function>
    "xml-wrapped"       the same inside <tool_call></tool_call> (Qwen3-Coder's call syntax)

A link.yaml local model takes `tool_format: xml`, or a dict of the fields above plus `base` (a registered
name to start from), e.g. `{base: json, call_open: "<call>", call_close: "</call>"}`
(`tool_format_from_config`). `check_tools` refuses, before anything runs, a tool schema the format cannot
carry, naming the tool and parameter.

    fmt = tool_format_from_config("xml")
    fmt.check_tools(tools)                                   # ToolFormatError naming the tool and parameter
    text = fmt.render_call("get_weather", {"city": "Paris"}, tools)
    calls = fmt.parse_block(inner_text, tools)               # OpenAI tool_calls or None
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from serving.tools.styles import (
    ToolFormatError, check_xml_tools, json_calls, parameter_schemas, tool_call, tool_functions, xml_call, xml_calls,
)

__all__ = ["DEFAULT_FORMAT", "FORMATS", "ToolCallFormat", "ToolFormatError", "register_format", "tool_call",
           "tool_format_from_config", "tool_functions"]

STYLES = ("json", "xml")
SYSTEM_PLACEHOLDERS = ("tools", "call_example", "block", "parallel_rule", "choice_rule")
RESPONSE_PLACEHOLDERS = ("name", "id", "content")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

JSON_SYSTEM_TEMPLATE = """# Tools

You can call these functions. Each line in <tools></tools> describes one:
<tools>
{tools}
</tools>

To call a function, write a JSON object with its name and arguments inside a {block} block:
{call_example}
{parallel_rule}
Results come back in <tool_response></tool_response> blocks.
{choice_rule}"""

XML_SYSTEM_TEMPLATE = """# Tools

You can call these functions. Each line in <tools></tools> describes one:
<tools>
{tools}
</tools>

To call a function, write a {block} block with its name and one parameter element per argument:
{call_example}
A string value is plain text; numbers, booleans, arrays and objects are JSON.
{parallel_rule}
Results come back in <tool_response></tool_response> blocks.
{choice_rule}"""

RESPONSE_TEMPLATE = '<tool_response name="{name}" tool_call_id="{id}">\n{content}\n</tool_response>'


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with each `{key}` of `values` replaced in one pass; a line that is only an empty placeholder is dropped."""
    lines = [line for line in template.split("\n")
             if not ((m := _PLACEHOLDER.fullmatch(line.strip())) and m.group(1) in values and values[m.group(1)] == "")]
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), "\n".join(lines))


@dataclass(frozen=True)
class ToolCallFormat:
    """One harness format (see the module docstring). Built with `tool_format_from_config` or directly.

    Raises:
        ToolFormatError: an invalid field or combination, naming the field and what to write instead.
    """

    name: str = "json"
    style: str = "json"
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    system_template: str = JSON_SYSTEM_TEMPLATE
    response_template: str = RESPONSE_TEMPLATE
    name_key: str = "name"
    arguments_key: str = "arguments"
    nested_values: str = "json"
    fenced_calls: str = "content"

    def __post_init__(self):
        where = f"tool format {self.name!r}"
        for key, value in dataclasses.asdict(self).items():
            if not isinstance(value, str):
                raise ToolFormatError(f"{where}: `{key}` must be a string, got {value!r}")
        if not self.name:
            raise ToolFormatError("tool format: `name` must be a non-empty string")
        if self.style not in STYLES:
            raise ToolFormatError(f"{where}: unknown `style` {self.style!r}; use one of {', '.join(STYLES)}")
        if bool(self.call_open) != bool(self.call_close) or (self.style == "json" and not self.call_open):
            raise ToolFormatError(f"{where}: `call_open` and `call_close` must both be set"
                                  + (" (style json needs block tags)" if self.style == "json" else " or both be empty"))
        if self.call_open and self.call_open in self.call_close:
            raise ToolFormatError(f"{where}: `call_close` {self.call_close!r} must not contain `call_open` {self.call_open!r}")
        self._check_template("system_template", self.system_template, SYSTEM_PLACEHOLDERS, "tools")
        self._check_template("response_template", self.response_template, RESPONSE_PLACEHOLDERS, "content")
        if not self.name_key or not self.arguments_key or self.name_key == self.arguments_key:
            raise ToolFormatError(f"{where}: `name_key` and `arguments_key` must be two different non-empty keys")
        if self.nested_values not in ("json", "refuse"):
            raise ToolFormatError(f"{where}: `nested_values` must be 'json' (JSON-encode objects and arrays) or "
                                  f"'refuse', got {self.nested_values!r}")
        if self.fenced_calls not in ("content", "call") or (self.fenced_calls == "call" and self.style != "json"):
            raise ToolFormatError(f"{where}: `fenced_calls` must be 'content' or (style json) 'call', got {self.fenced_calls!r}")

    def _check_template(self, key: str, template: str, allowed: tuple[str, ...], required: str) -> None:
        unknown = sorted(set(_PLACEHOLDER.findall(template)) - set(allowed))
        if unknown:
            raise ToolFormatError(f"tool format {self.name!r}: `{key}` has unknown placeholder(s) "
                                  f"{', '.join('{' + u + '}' for u in unknown)}; allowed: {', '.join('{' + a + '}' for a in allowed)}")
        if "{" + required + "}" not in template:
            raise ToolFormatError(f"tool format {self.name!r}: `{key}` must contain {{{required}}}")

    @property
    def block_open(self) -> str:
        """The text that starts a call block (`call_open`, or `<function=` for a bare xml call)."""
        return self.call_open or "<function="

    @property
    def block_close(self) -> str:
        return self.call_close or "</function>"

    @property
    def block(self) -> str:
        """The block's name in instructions ("tool_call" for `<tool_call>`)."""
        return self.call_open.strip("<>") or "function"

    @property
    def result_open(self) -> str:
        """The text that starts a tool result block: `response_template`'s literal text before its first
        placeholder, a tag cut to its name (`<tool_response`, so a bare `<tool_response>` matches too);
        "" when the template starts with a placeholder. A model writing it after a tool result is echoing
        the harness, not answering (`SamplingParams.echo_markers`, `serving.frontend.chat_tools`)."""
        head = self.response_template[:_PLACEHOLDER.search(self.response_template).start()].strip()
        tag = re.match(r"<[^\s<>]+", head)
        return tag.group(0) if tag else head

    @property
    def result_close(self) -> str:
        """The text that ends a tool result block: `response_template`'s literal text after its last placeholder
        (`</tool_response>`); "" when the template ends with a placeholder."""
        last = list(_PLACEHOLDER.finditer(self.response_template))[-1]
        return self.response_template[last.end():].strip()

    @property
    def can_force(self) -> bool:
        """Whether a forcing tool_choice is enforced by constrained decoding (`serving.guided.tool_choice`: style json)."""
        return self.style == "json"

    def render_system_prompt(self, functions: Sequence[dict], choice_rule: str, parallel_rule: str) -> str:
        """The system text offering `functions` (OpenAI `function` objects) with the given rule sentences."""
        tools = "\n".join(json.dumps({"name": fn["name"], "description": fn.get("description", ""),
                                      "parameters": fn.get("parameters", {})}, ensure_ascii=False) for fn in functions)
        return fill(self.system_template, {"tools": tools, "call_example": self.call_example(), "block": self.block,
                                           "parallel_rule": parallel_rule, "choice_rule": choice_rule})

    def call_example(self) -> str:
        """The call syntax shown in the system prompt."""
        if self.style == "json":
            keys = json.dumps(self.name_key), json.dumps(self.arguments_key)
            return self._wrap(f'{{{keys[0]}: "<function name>", {keys[1]}: {{<argument name>: <value>, ...}}}}')
        return self._wrap("<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n...\n</function>")

    def _wrap(self, body: str) -> str:
        return f"{self.call_open}\n{body}\n{self.call_close}" if self.call_open else body

    def render_call(self, name: str, arguments: Any, tools: Sequence[dict] | None = None) -> str:
        """One call as the model writes it.

        Args:
            name: the function name.
            arguments: a dict, or OpenAI's JSON text of one (text that is not JSON is written as it is, style json).
            tools: the offered OpenAI tools; style xml types the values by their schemas.
        Raises:
            ToolFormatError: style xml with arguments that are not a JSON object.
        """
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # kept as the string it is, so the model sees what was sent
        if self.style == "json":
            return self._wrap(json.dumps({self.name_key: name, self.arguments_key: arguments}, ensure_ascii=False))
        if not isinstance(arguments, dict):
            raise ToolFormatError(f"a call to {name!r}: the {self.name!r} tool format needs arguments that are a JSON "
                                  f"object, got {arguments!r}")
        return self._wrap(xml_call(name, arguments, (parameter_schemas(tools) or {}).get(name, {})))

    def render_result(self, name: str, call_id: str, content: str) -> str:
        """One tool result block (`response_template` filled in)."""
        return fill(self.response_template, {"name": name, "id": call_id, "content": content})

    def parse_block(self, inner: str, tools: Sequence[dict] | None) -> list[dict] | None:
        """The OpenAI calls in the text between `block_open` and `block_close`, or None when it is not a
        well-formed call (or list of calls) naming offered functions (any name when `tools` is None)."""
        schemas = parameter_schemas(tools)
        if self.style == "json":
            return json_calls(inner, schemas, self.name_key, self.arguments_key)
        return xml_calls(inner if self.call_open else self.block_open + inner + self.block_close, schemas)

    def check_tools(self, tools: Sequence[dict] | None) -> None:
        """Refuse tools whose calls this format cannot write and read back (style json carries any schema).

        Raises:
            ToolFormatError: malformed tools; style xml: a name with whitespace, `<`, `>`, `=` or `/`; with
                nested_values "refuse", a parameter of type object, array or none.
        """
        tool_functions(tools)
        if self.style == "xml":
            check_xml_tools(tools, self.name, scalars_only=self.nested_values == "refuse")


DEFAULT_FORMAT = ToolCallFormat()
XML_FORMAT = ToolCallFormat(name="xml", style="xml", call_open="", call_close="", system_template=XML_SYSTEM_TEMPLATE)
XML_WRAPPED_FORMAT = ToolCallFormat(name="xml-wrapped", style="xml", system_template=XML_SYSTEM_TEMPLATE)
FORMATS: dict[str, ToolCallFormat] = {"default": DEFAULT_FORMAT, "json": DEFAULT_FORMAT, "xml": XML_FORMAT,
                                      "xml-wrapped": XML_WRAPPED_FORMAT}
_FIELDS = tuple(f.name for f in dataclasses.fields(ToolCallFormat))


def register_format(fmt: ToolCallFormat) -> ToolCallFormat:
    """Make `fmt` available by its name (`tool_format: <name>`); returns it."""
    FORMATS[fmt.name] = fmt
    return fmt


def tool_format_from_config(value: str | dict | ToolCallFormat | None) -> ToolCallFormat:
    """A format from config: None (the default), a registered name, or a dict of `ToolCallFormat` fields plus
    an optional `base` (a registered name; default "xml" when `style` is xml, else "json") it starts from.
    A dict without `name` is named "custom".

    Raises:
        ToolFormatError: an unknown name or key, or invalid fields (see `ToolCallFormat`).
    """
    if value is None or isinstance(value, ToolCallFormat):
        return value or DEFAULT_FORMAT
    if isinstance(value, str):
        if value not in FORMATS:
            raise ToolFormatError(f"unknown tool format {value!r}; registered: {', '.join(sorted(FORMATS))}, or give a dict of fields")
        return FORMATS[value]
    if not isinstance(value, dict):
        raise ToolFormatError(f"tool_format must be a registered name or a dict of fields, got {value!r}")
    unknown = sorted(set(value) - set(_FIELDS) - {"base"})
    if unknown:
        raise ToolFormatError(f"tool_format: unknown key(s) {', '.join(map(str, unknown))}; allowed: base, {', '.join(_FIELDS)}")
    base = value.get("base") or ("xml" if value.get("style") == "xml" else "json")
    if not isinstance(base, str):
        raise ToolFormatError(f"tool_format: `base` must be a registered format name, got {base!r}")
    fields = {k: v for k, v in value.items() if k != "base"}
    return dataclasses.replace(tool_format_from_config(base), **{"name": "custom", **fields})
