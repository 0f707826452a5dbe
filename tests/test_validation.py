"""ToolCallValidator: each stage of the pipeline, the report, the correction, properties."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentguard import GuardConfig, ToolSchemaError
from agentguard.events import GuardInternalError, ToolCallRejected, ToolCallRepaired
from agentguard.testing import Reply, capture_events
from agentguard.validation import ToolCallValidator, extract_calls
from agentguard.validation._tools import acts_by_name
from agentguard.validation._validator import _accepted

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the docs.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "mode": {"type": "string", "enum": ["fast", "deep", "string"]},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_terminal_command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                "required": ["to", "body"],
            },
        },
    },
]


def _v(**config: Any) -> ToolCallValidator:
    cfg = GuardConfig.from_dict(
        {"tool_validation": {"side_effecting": ["send_email"], **config}}, env={}
    )
    return ToolCallValidator(TOOLS, cfg)


def _kinds(report: Any) -> list[str]:
    return [e.kind for e in report.errors]


def test_valid_call_is_untouched_byte_for_byte() -> None:
    """Odd but valid formatting is not rewritten."""
    raw = '{ "query" :  "install",\n "limit": 3 }'
    report = _v().validate(Reply.call("search", raw, id="c1").message())
    assert report.ok
    assert report.repairs == ()
    assert report.tool_calls[0].arguments == raw
    assert report.tool_calls[0].id == "c1"


@pytest.mark.parametrize(
    "style",
    ["hermes", "hermes_unclosed", "function_tag", "python_tag", "mistral", "fenced", "bare"],
)
def test_text_embedded_calls_are_extracted(style: Any) -> None:
    """Every common text format becomes a real tool call."""
    report = _v().validate(Reply.embedded("search", {"query": "x"}, style=style).message())
    assert report.ok
    assert report.extracted
    assert [c.name for c in report.tool_calls] == ["search"]
    assert report.repairs[0].kind == "extracted_from_text"


def test_llama_semicolon_separated_calls() -> None:
    """Llama's python_tag with several ';'-separated calls gives several calls."""
    content = '<|python_tag|>{"name": "search", "parameters": {"query": "a"}}; {"name": "search", "parameters": {"query": "b"}}'
    report = _v().validate({"role": "assistant", "content": content})
    assert [json.loads(c.arguments)["query"] for c in report.tool_calls] == ["a", "b"]


def test_extracted_calls_of_different_answers_have_different_ids() -> None:
    """Calls extracted from two answers never share an id (frameworks refuse a repeated one);
    within one answer they are numbered."""
    first = _v().validate(Reply.embedded("search", {"query": "a"}, style="hermes").message())
    second = _v().validate(Reply.embedded("search", {"query": "b"}, style="hermes").message())
    (one,), (two,) = first.tool_calls, second.tool_calls
    assert one.id != two.id
    # nine letters and digits: Mistral's API and chat templates take no other id
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", call.id or "") for call in (one, two))
    both = _v().validate(
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "search", "arguments": {"query": "a"}}'
            '</tool_call><tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>',
        }
    )
    assert len({c.id for c in both.tool_calls}) == 2


def test_prose_with_json_is_left_alone() -> None:
    """Ordinary JSON or braces in an answer are not mistaken for calls."""
    for text in [
        'The config is {"debug": true}.',
        "Use {name} as a template.",
        '```json\n{"a": 1}\n```',
    ]:
        report = _v().validate({"role": "assistant", "content": text})
        assert report.ok
        assert report.tool_calls == ()
        assert not report.extracted


def test_prose_around_an_extracted_call_is_kept() -> None:
    """The text before a call is kept as the message's content."""
    found = extract_calls(
        'Let me check.\n<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
    )
    assert found is not None
    assert found.remaining == "Let me check."


def test_broken_json_is_repaired() -> None:
    """Single quotes, trailing commas, Python literals and fences are repaired locally."""
    for raw in (
        "{'query': 'x',}",
        '{"query": "x", "exact": True}',
        '```json\n{"query": "x"}\n```',
        '{"query": "x"} trailing words',
    ):
        report = _v().validate(Reply.call("search", raw).message())
        assert report.ok, (raw, _kinds(report))
        assert json.loads(report.tool_calls[0].arguments)["query"] == "x"
        assert report.repairs[0].kind == "json_repaired"


def test_double_encoded_arguments_are_unwrapped() -> None:
    """A JSON string holding the JSON object is decoded once more."""
    raw = json.dumps(json.dumps({"query": "x"}))
    report = _v().validate(Reply.call("search", raw).message())
    assert report.ok
    assert report.repairs[0].kind == "double_encoded"


def test_truncated_arguments_are_never_completed() -> None:
    """finish_reason=length: cut-off arguments are reported, not repaired."""
    report = _v().validate(
        Reply.call("search", '{"query": "inst').message(), finish_reason="length"
    )
    assert _kinds(report) == ["truncated"]
    assert report.repairs == ()


def test_non_object_arguments_are_invalid() -> None:
    """An array or a number is not an arguments object."""
    for raw in ("[1, 2]", "42"):
        assert _kinds(_v().validate(Reply.call("search", raw).message())) == ["invalid_json"]


@pytest.mark.parametrize("raw", ["null", " null ", "", "{}"])
def test_null_or_empty_arguments_are_no_arguments(raw: str) -> None:
    """Groq sends ``"null"`` for a call of a tool without parameters (langchain-ai/langchain
    #33896), others ``""``: no arguments, valid for such a tool, and passed on as sent; for a
    tool that requires some, the error names what is missing (not "not a JSON object")."""
    tools = [*TOOLS, {"type": "function", "function": {"name": "now", "parameters": {}}}]
    report = ToolCallValidator(tools).validate(Reply.call("now", raw, id="c1").message())
    assert report.ok
    assert report.repairs == ()
    assert report.tool_calls[0].arguments == raw
    assert _kinds(_v().validate(Reply.call("search", raw).message())) == ["missing_required"]


def test_repair_is_skipped_above_the_size_limit() -> None:
    """Above max_repair_bytes broken JSON is an error: repair cost stays bounded."""
    raw = "{'query': '" + "x" * 200 + "'}"
    report = _v(max_repair_bytes=100).validate(Reply.call("search", raw).message())
    assert _kinds(report) == ["invalid_json"]


def test_tool_name_normalised_and_fuzzy() -> None:
    """Case and separators are forgiven; a clear synonym match is corrected (onto a tool whose
    name says it acts only with that rule switched off)."""
    for wrong in ("Search", "SEARCH", "search-"):
        report = _v().validate(Reply.call(wrong, {"query": "x"}).message())
        assert report.ok, wrong
        assert report.tool_calls[0].name == "search"
    synonym = Reply.call("execute_shell_command", {"command": "ls"}).message()
    report = _v(side_effecting_by_name=False).validate(synonym)
    assert report.tool_calls[0].name == "run_terminal_command"
    report = _v().validate(synonym)
    assert _kinds(report) == ["unknown_tool"]
    assert report.errors[0].suggestions[0] == "run_terminal_command"


def test_unknown_tool_gets_the_closest_names() -> None:
    """A name matching nothing clearly is an error with up to three suggestions."""
    report = _v().validate(Reply.call("create_meeting_v2", {"when": "now"}).message())
    (error,) = report.errors
    assert error.kind == "unknown_tool"
    assert len(error.suggestions) <= 3


def test_side_effecting_tools_are_never_guessed() -> None:
    """A near miss of a side-effecting tool is not auto-corrected."""
    report = _v().validate(Reply.call("send_emails", {"to": "a@b.c", "body": "hi"}).message())
    assert _kinds(report) == ["unknown_tool"]
    assert report.errors[0].suggestions[0] == "send_email"


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"command": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": schema}, **extra}


AGENT_TOOLS = [_tool("terminal"), _tool("execute_bash"), _tool("read_file"), _tool("grep")]


@pytest.mark.parametrize(
    "name",
    ["terminal", "execute_bash", "run_shell", "writeFile", "send-email", "str_replace_editor",
     "apply_patch", "DeleteUser", "git_push", "rm", "make_payment", "deploy", "kill_process"],
)  # fmt: skip
def test_names_that_say_they_act(name: str) -> None:
    """Whole words of the name, split on case and separators, say a tool acts."""
    assert acts_by_name(name)


@pytest.mark.parametrize(
    "name",
    ["read_file", "grep", "search", "get_weather", "list_files", "view", "glob", "think",
     "finish", "lookup_order_status", "runtime_info", "settings", "sendgrid_stats"],
)  # fmt: skip
def test_names_that_do_not(name: str) -> None:
    """A word must match whole: ``runtime`` is not ``run``, ``settings`` is not ``set``."""
    assert not acts_by_name(name)


@pytest.mark.parametrize("invented", ["run_shell", "shell", "bash", "run_command", "exec"])
def test_invented_shell_tools_are_never_corrected_onto_a_real_one(invented: str) -> None:
    """A made-up shell tool is never auto-corrected to ``terminal`` or ``execute_bash`` (and
    executed): it is an unknown tool, and the real ones are offered in the correction."""
    report = ToolCallValidator(AGENT_TOOLS).validate(
        Reply.call(invented, {"command": "ls"}).message()
    )
    assert _kinds(report) == ["unknown_tool"]
    assert report.tool_calls[0].name == invented
    assert not report.repairs


@pytest.mark.parametrize("near_miss", ["open_file", "file_read", "view_file", "Read-File"])
def test_read_only_near_misses_are_still_corrected(near_miss: str) -> None:
    """A near miss of a read-only tool is still corrected for free."""
    report = ToolCallValidator(AGENT_TOOLS).validate(Reply.call(near_miss, {}).message())
    assert report.ok
    assert report.tool_calls[0].name == "read_file"


def test_the_name_rule_can_be_switched_off() -> None:
    """``side_effecting_by_name: false``: only listed (or annotated) tools are protected."""
    config = GuardConfig.from_dict(
        {"tool_validation": {"side_effecting_by_name": False, "side_effecting": ["terminal"]}},
        env={},
    )
    validator = ToolCallValidator(AGENT_TOOLS, config)
    assert not validator.specs["execute_bash"].side_effecting
    assert validator.specs["terminal"].side_effecting  # the list still adds names
    report = validator.validate(Reply.call("execute-bash", {"command": "ls"}).message())
    assert report.tool_calls[0].name == "execute_bash"


def test_annotations_say_whether_a_tool_acts() -> None:
    """MCP / OpenHands annotations win over the name; the configured list wins over both."""
    tools = [
        _tool("run_query", annotations={"readOnlyHint": True}),
        _tool("lights", annotations={"readOnlyHint": False, "destructiveHint": False}),
        {"type": "function", "function": {**_tool("doors")["function"], "annotations": {
            "destructiveHint": True}}},
        _tool("terminal", annotations={"readOnlyHint": True}),
        _tool("weather", annotations={"title": "Weather"}),
    ]  # fmt: skip
    cfg = GuardConfig.from_dict({"tool_validation": {"side_effecting": ["terminal"]}}, env={})
    specs = ToolCallValidator(tools, cfg).specs
    acting = {name for name, spec in specs.items() if spec.side_effecting}
    assert acting == {"lights", "doors", "terminal"}
    report = ToolCallValidator(tools, cfg).validate(Reply.call("execute_query", {}).message())
    assert report.tool_calls[0].name == "run_query"


def test_every_schema_error_at_once() -> None:
    """Missing, wrong-typed and unexpected arguments are all reported in one pass."""
    report = _v().validate(Reply.call("search", {"limit": [1], "colour": "red"}).message())
    kinds = sorted(_kinds(report))
    assert kinds == ["missing_required", "type_mismatch", "unexpected_argument"]
    paths = {e.kind: e.path for e in report.errors}
    assert paths["missing_required"] == "$.query"
    assert paths["type_mismatch"] == "$.limit"
    assert paths["unexpected_argument"] == "$.colour"


def test_unexpected_argument_policy() -> None:
    """Undeclared arguments can also be dropped (a repair) or allowed."""
    message = Reply.call("search", {"query": "x", "colour": "red"}).message()
    dropped = _v(unexpected_arguments="drop").validate(message)
    assert dropped.ok
    assert json.loads(dropped.tool_calls[0].arguments) == {"query": "x"}
    assert _v(unexpected_arguments="allow").validate(message).ok


def test_lossless_coercion() -> None:
    """'5' becomes 5 for an integer and 'true' becomes true; nothing else changes meaning."""
    report = _v().validate(
        Reply.call("search", {"query": "x", "limit": "5", "exact": "true"}).message()
    )
    assert report.ok
    assert json.loads(report.tool_calls[0].arguments) == {"query": "x", "limit": 5, "exact": True}
    lossy = _v().validate(Reply.call("search", {"query": "x", "limit": "5.5"}).message())
    assert _kinds(lossy) == ["type_mismatch"]
    off = _v(coerce=False).validate(Reply.call("search", {"query": "x", "limit": "5"}).message())
    assert _kinds(off) == ["type_mismatch"]


@pytest.mark.parametrize("value", ["<query>", "{query}", "string", "...", "YOUR_KEY_HERE", "TODO"])
def test_placeholders(value: str) -> None:
    """Template-like values are placeholder_argument."""
    assert _kinds(_v().validate(Reply.call("search", {"query": value}).message())) == [
        "placeholder_argument"
    ]


def test_enum_value_is_never_a_placeholder() -> None:
    """A value the schema explicitly allows is not a placeholder, even if it looks like one."""
    assert _v().validate(Reply.call("search", {"query": "x", "mode": "string"}).message()).ok


def test_empty_required_string() -> None:
    """An empty required string is empty_argument."""
    assert _kinds(_v().validate(Reply.call("search", {"query": "  "}).message())) == [
        "empty_argument"
    ]


def test_corrective_messages_shape() -> None:
    """The failed message (content "" not null), then a tool message per failing call id."""
    message = Reply.calls([("search", {}, "c1"), ("search", {"query": "ok"}, "c2")]).message()
    report = _v().validate(message)
    out = report.corrective_messages()
    assert out[0]["role"] == "assistant"
    assert out[0]["content"] == ""
    assert [m.get("tool_call_id") for m in out[1:]] == ["c1", "c2"]
    text = out[1]["content"]
    assert "automated feedback" in text
    assert "$.query" in text
    assert "Expected parameters of search" in text
    assert "not executed" in out[2]["content"].lower()


def test_correction_without_ids_is_a_user_message() -> None:
    """Errors of calls extracted from text (no ids sent) go in a user message."""
    report = _v().validate(
        {"role": "assistant", "content": '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'}
    )
    out = report.corrective_messages()
    assert out[-1]["role"] == "user"
    assert "Available tools" in out[-1]["content"]
    assert "Available tools" in report.corrective_text()


def test_openai_message_objects_and_responses_items() -> None:
    """openai ChatCompletionMessage objects and Responses function_call items are accepted."""
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletionMessage

    msg = ChatCompletionMessage.model_validate(Reply.call("search", {"query": "x"}).message())
    assert _v().validate(msg).ok
    items = [
        {"type": "function_call", "call_id": "fc1", "name": "search", "arguments": '{"query": "x"}'}
    ]
    report = _v().validate(items)
    assert report.ok
    assert report.tool_calls[0].id == "fc1"
    assert openai is not None


def test_tool_sources() -> None:
    """Bare function specs, pydantic models and typed functions all give schemas."""

    class Lookup(BaseModel):
        """Look a word up."""

        word: str
        limit: int = 3

    def fetch_page(url: str, timeout: float = 5.0) -> str:
        """Fetch a page."""
        return url

    bare = {"name": "ping", "parameters": {"type": "object", "properties": {}}}
    validator = ToolCallValidator([bare, Lookup, fetch_page])
    assert set(validator.specs) == {"ping", "Lookup", "fetch_page"}
    assert validator.validate(Reply.call("fetch_page", {"url": "http://x"}).message()).ok
    assert _kinds(validator.validate(Reply.call("Lookup", {"limit": 1}).message())) == [
        "missing_required"
    ]


def test_responses_and_anthropic_tool_definitions_are_read() -> None:
    """The Responses API's flat function tools and Anthropic's ``input_schema`` definitions give
    the same specs as the chat format."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    flat = {"type": "function", "name": "get_weather", "parameters": schema}
    anthropic = {"name": "get_time", "description": "Now.", "input_schema": schema}
    validator = ToolCallValidator([flat, anthropic])
    assert validator.specs["get_weather"].parameters == schema
    assert validator.specs["get_time"].parameters == schema
    assert validator.validate(Reply.call("get_weather", {"city": "Oslo"}).message()).ok
    assert _kinds(validator.validate(Reply.call("get_time", {}).message())) == ["missing_required"]
    with pytest.raises(ToolSchemaError, match="must be an object"):
        ToolCallValidator([{"type": "function", "function": "get_weather"}])


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ({"type": "function", "function": {"name": "", "parameters": {}}}, "non-empty"),
        (
            {"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}},
            "object schema",
        ),
        (
            {
                "type": "function",
                "function": {
                    "name": "x",
                    "parameters": {"type": "object", "properties": {"a": {"type": 7}}},
                },
            },
            "invalid JSON Schema",
        ),
    ],
)
def test_bad_tool_definitions_fail_once_with_the_tool_named(tool: Any, problem: str) -> None:
    """An unusable schema is rejected at construction."""
    with pytest.raises(ToolSchemaError, match=problem):
        ToolCallValidator([tool])


def test_duplicate_tool_names_are_rejected() -> None:
    """Two tools with one name are ambiguous."""
    with pytest.raises(ToolSchemaError, match="twice"):
        ToolCallValidator([TOOLS[0], TOOLS[0]])


UNUSABLE = [
    {"type": "function", "function": {"name": "", "parameters": {}}},  # no name: left out
    {
        "type": "function",
        "function": {
            "name": "typo",
            "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}},
        },
    },
    {"type": "function", "function": {"name": "listed", "parameters": {"type": "array"}}},
    TOOLS[0],
    {"type": "function", "function": {"name": TOOLS[0]["function"]["name"], "parameters": {}}},
]


def test_a_lenient_validator_keeps_the_tools_it_cannot_read_by_name() -> None:
    """``lenient`` (how the guard reads a request's tools): an unusable definition does not
    raise; the tool keeps its name, its calls are checked for being a JSON object only, a tool
    defined twice keeps its first definition, and an event names each problem once."""
    with capture_events() as events:
        validator = ToolCallValidator(UNUSABLE, lenient=True)
    assert set(validator.specs) == {"typo", "listed", TOOLS[0]["function"]["name"]}
    said = [e.message for e in events.of_type(GuardInternalError)]
    assert len(said) == 4
    assert all(e.component == "tool_validation" for e in events.of_type(GuardInternalError))
    assert any("'typo': invalid JSON Schema" in m for m in said)
    assert any("twice" in m for m in said)
    assert validator.validate(Reply.call("typo", {"a": 1, "b": [2]}).message()).ok
    assert _kinds(validator.validate(Reply.call("listed", "[1, 2]").message())) == ["invalid_json"]
    first = TOOLS[0]["function"]
    assert validator.specs[first["name"]].parameters == first["parameters"]
    assert _kinds(validator.validate(Reply.call("nope", {}).message())) == ["unknown_tool"]


SELF_REFERRING = {"$ref": "#"}
CYCLE = {
    "type": "object",
    "properties": {"x": {"$ref": "#/$defs/a"}},
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
}
REMOTE = {"type": "object", "properties": {"x": {"$ref": "https://schemas.invalid/x.json"}}}


@pytest.mark.parametrize("schema", [SELF_REFERRING, CYCLE, REMOTE], ids=["self", "cycle", "remote"])
def test_a_schema_that_cannot_be_applied_is_a_typed_error_or_dropped_once(schema: Any) -> None:
    """A schema jsonschema accepts but cannot apply (a ``$ref`` into itself forever, one that
    cannot be resolved offline) raised RecursionError or a referencing error out of validate();
    now it is a ToolSchemaError naming the tool, and with ``lenient`` the tool's calls are read
    as JSON objects from then on, said once."""
    tool = {"type": "function", "function": {"name": "t", "parameters": schema}}
    call = Reply.call("t", {"x": 1}).message()
    with pytest.raises(ToolSchemaError, match="'t': the schema cannot be applied"):
        ToolCallValidator([tool]).validate(call)
    with capture_events() as events:
        validator = ToolCallValidator([tool], lenient=True)
        assert validator.validate(call).ok
        assert validator.validate(call).ok
    assert len(events.of_type(GuardInternalError)) == 1
    assert _kinds(validator.validate(Reply.call("t", "[1]").message())) == ["invalid_json"]


def test_events() -> None:
    """Repairs and rejections are events."""
    with capture_events() as events:
        _v().validate(Reply.call("Search", {"query": "<q>"}).message())
    assert events.of_type(ToolCallRepaired)[0].repair == "tool_name"
    assert events.of_type(ToolCallRejected)[0].error == "placeholder_argument"


def test_secrets_never_reach_errors() -> None:
    """An API key passed as an argument value is redacted in errors."""
    report = _v().validate(
        Reply.call("search", {"query": "x", "api": "sk-live-0123456789abcdef"}).message()
    )
    assert all("sk-live-0123456789abcdef" not in str(e.value) + e.message for e in report.errors)


json_objects = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    """Any bytes as arguments give a report; a failure is a typed error."""
    raw = data.decode("utf-8", "replace")
    report = _v().validate(Reply.call("search", raw).message())
    assert report.ok or all(e.kind for e in report.errors)


@settings(max_examples=150, deadline=None)
@given(
    st.text(min_size=1, max_size=40).filter(
        lambda q: q.strip() and not q.strip().startswith(("<", "{", "["))
    )
)
def test_a_valid_call_is_never_altered(query: str) -> None:
    """Valid calls come back exactly as sent, whatever the (non-placeholder) query."""
    raw = json.dumps({"query": query})
    report = _v().validate(Reply.call("search", raw).message())
    if report.ok:
        assert report.tool_calls[0].arguments == raw
        assert report.repairs == ()


@settings(max_examples=150, deadline=None)
@given(json_objects, st.sampled_from(["drop_quote", "trailing_comma", "single_quotes"]))
def test_repairs_never_pass_invalid_calls_silently(args: dict[str, Any], breakage: str) -> None:
    """Whatever repair produced is validated too: an ok report means a schema-valid call."""
    text = json.dumps({"query": "x", **args})
    broken = {
        "drop_quote": text.replace('"', "", 1),
        "trailing_comma": text[:-1] + ",}",
        "single_quotes": text.replace('"', "'"),
    }[breakage]
    report = _v(unexpected_arguments="allow").validate(Reply.call("search", broken).message())
    if report.ok:
        parsed = json.loads(report.tool_calls[0].arguments)
        assert isinstance(parsed, dict)
        assert isinstance(parsed.get("query"), str)


def test_arguments_cut_off_inside_a_string_are_truncated_not_repaired() -> None:
    """`{"path": "setu` is a cut-off value: reported as truncated even without finish=length."""
    validator = ToolCallValidator(
        [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    )
    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "setu'},
            }
        ],
    }
    report = validator.validate(message, finish_reason="tool_calls")
    assert not report.ok
    assert [e.kind for e in report.errors] == ["truncated"]
    assert not report.repairs


# -- tool_choice and parallel_tool_calls ----------------------------------------------------------

PINNED = {"type": "function", "function": {"name": "search"}}
PINNED_RESPONSES = {"type": "function", "name": "search"}
SEARCH = Reply.call("search", {"query": "install"}).message()
SHELL = Reply.call("run_terminal_command", {"command": "ls"}).message()
TEXT = {"role": "assistant", "content": "The install docs are at /docs."}
ALLOWED = {  # chat's form of tool_choice allowed_tools
    "type": "allowed_tools",
    "allowed_tools": {
        "mode": "auto",
        "tools": [{"type": "function", "function": {"name": "search"}}],
    },
}
ALLOWED_RESPONSES = {  # the Responses API's
    "type": "allowed_tools",
    "mode": "auto",
    "tools": [{"type": "function", "name": "search"}],
}


@pytest.mark.parametrize(
    ("message", "choice", "kinds"),
    [
        (TEXT, "required", ["call_required"]),
        (TEXT, PINNED, ["call_required"]),
        (TEXT, PINNED_RESPONSES, ["call_required"]),
        (TEXT, "auto", []),
        (TEXT, None, []),
        (TEXT, "none", []),
        (SHELL, PINNED, ["not_chosen"]),
        (SHELL, PINNED_RESPONSES, ["not_chosen"]),
        (SHELL, "required", []),
        (SEARCH, PINNED, []),
        ({"role": "assistant", "content": None, "refusal": "I can't."}, "required", []),
        (SEARCH, "none", ["not_chosen"]),
        (SHELL, ALLOWED, ["not_chosen"]),
        (SHELL, ALLOWED_RESPONSES, ["not_chosen"]),
        (SEARCH, ALLOWED, []),
        (TEXT, ALLOWED, []),
        (TEXT, {**ALLOWED_RESPONSES, "mode": "required"}, ["call_required"]),
        (
            TEXT,
            {
                "type": "allowed_tools",
                "allowed_tools": {**ALLOWED["allowed_tools"], "mode": "required"},
            },
            ["call_required"],
        ),
    ],
)
def test_an_answer_that_breaks_tool_choice_is_a_failed_call(
    message: dict[str, Any], choice: Any, kinds: list[str]
) -> None:
    """Text where ``tool_choice`` asks for a call, or a call to another tool than the one it
    names (servers that ignore ``tool_choice``): an error whose suggestion is the tool asked
    for; a refusal is an answer, never corrected."""
    report = _v().validate(message, "stop", tool_choice=choice)
    assert _kinds(report) == kinds
    if kinds and choice not in ("required", "none"):
        assert report.errors[0].suggestions == ("search",)
    assert _v(enforce_tool_choice=False).validate(message, "stop", tool_choice=choice).ok


def test_a_call_written_as_text_stays_text_under_tool_choice_none() -> None:
    """``tool_choice: "none"`` and a model that writes a call in its text anyway: the text was
    read as a call and the caller got a tool call it had ruled out. Now it stays text, as the
    raw client shows it."""
    hermes = Reply.embedded("search", {"query": "install"}, style="hermes").message()
    report = _v().validate(hermes, "stop", tool_choice="none")
    assert report.ok
    assert report.tool_calls == ()
    assert report.content == hermes["content"]
    assert not report.extracted
    assert [c.name for c in _v().validate(hermes, "stop", tool_choice="auto").tool_calls] == [
        "search"
    ]


def test_calls_after_the_first_are_dropped_when_parallel_calls_are_off() -> None:
    """``parallel_tool_calls: false`` and two calls: the first is kept (a repair, reported);
    the model makes the next one in its next turn."""
    both = Reply.calls(
        [("search", {"query": "install"}, "c1"), ("run_terminal_command", {"command": "ls"}, "c2")]
    ).message()
    report = _v().validate(both, "tool_calls", parallel_tool_calls=False)
    assert report.ok
    assert [c.name for c in report.tool_calls] == ["search"]
    assert [(r.kind, r.tool_call_id, r.before) for r in report.repairs] == [
        ("dropped_parallel_calls", "c2", "run_terminal_command")
    ]
    assert len(_v().validate(both, "tool_calls", parallel_tool_calls=True).tool_calls) == 2
    assert len(_v().validate(both, "tool_calls").tool_calls) == 2


# -- arguments written as JSON text ------------------------------------------------------------


class _Address(BaseModel):
    city: str
    zip: str | None = None


class _Person(BaseModel):
    name: str
    home: _Address
    tags: list[str] = []
    note: str | dict[str, str] | None = None


PERSON = [
    {"type": "function", "function": {"name": "save", "parameters": _Person.model_json_schema()}}
]


def _save(args: dict[str, Any]) -> dict[str, Any]:
    return Reply.call("save", {"name": "Ann", **args}).message()


def test_a_nested_argument_written_as_json_text_is_decoded() -> None:
    """Models write a nested object or list as JSON text (``"home": "{\\"city\\": ..."``):
    where the schema (a pydantic model's ``$defs`` and ``$ref``) takes an object or a list and
    no string, the text is decoded (a ``coerced`` repair); where it takes a string too, or the
    text is no JSON, it stays as written."""
    validator = ToolCallValidator(PERSON, GuardConfig.from_dict({}, env={}))
    home = {"city": "Oslo", "zip": None}
    report = validator.validate(_save({"home": json.dumps(home), "tags": '["a", "b"]'}))
    assert report.ok
    assert json.loads(report.tool_calls[0].arguments) == {
        "name": "Ann",
        "home": home,
        "tags": ["a", "b"],
    }
    assert [r.path for r in report.repairs] == ["$.home", "$.tags"]
    kept = validator.validate(_save({"home": home, "note": '{"a": "b"}'}))
    assert kept.ok
    assert json.loads(kept.tool_calls[0].arguments)["note"] == '{"a": "b"}'  # a string fits
    broken = validator.validate(_save({"home": '{"city": "Oslo"'}))
    assert _kinds(broken) == ["type_mismatch"]
    off = ToolCallValidator(PERSON, GuardConfig.from_dict({"tool_validation": {"coerce": False}}))
    assert _kinds(off.validate(_save({"home": json.dumps(home)}))) == ["type_mismatch"]


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["city", "zip"]),
        st.one_of(st.text(max_size=20), st.none()),
    ).filter(lambda d: isinstance(d.get("city"), str))
)
def test_an_object_written_as_json_text_decodes_to_itself(home: dict[str, Any]) -> None:
    """Any object the schema takes, encoded as text, is decoded back to itself."""
    validator = ToolCallValidator(PERSON, GuardConfig.from_dict({}, env={}))
    report = validator.validate(_save({"home": json.dumps(home)}))
    assert report.ok
    assert json.loads(report.tool_calls[0].arguments)["home"] == home


def test_tool_choice_answered_by_a_call_of_another_kind_is_not_judged() -> None:
    """``"required"`` may be answered by a call the guard does not read (a custom tool's, a
    built-in's): with such tools offered, or such a call made, text beside it is no failure."""
    custom = {"type": "custom", "custom": {"name": "grammar", "description": "free text"}}
    builtin = {"type": "web_search_preview"}
    for extra in (custom, builtin):
        validator = ToolCallValidator([*TOOLS, extra], GuardConfig.from_dict({}, env={}))
        assert validator.validate(TEXT, "stop", tool_choice="required").ok
        assert _kinds(validator.validate(SHELL, "stop", tool_choice=PINNED)) == ["not_chosen"]
    made = {
        **TEXT,
        "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "g", "input": "x"}}],
    }
    assert _v().validate(made, "tool_calls", tool_choice="required").ok


def test_the_types_of_a_hostile_schema_are_found_in_bounded_steps() -> None:
    """A ``$ref`` cycle, or ``anyOf`` branches nested twenty deep ten wide (10^20 paths), are
    read in at most 64 steps, as taking any type: an argument is never decoded on a guess."""
    nested: dict[str, Any] = {"type": "object"}
    for _ in range(20):
        nested = {"anyOf": [nested] * 10}
    cycle = {"$ref": "#/$defs/A"}
    root = {"$defs": {"A": cycle}}
    assert "string" in _accepted(cycle, root)
    assert "string" in _accepted(nested, {})
    assert _accepted(
        {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]}, {"$defs": {"B": {"properties": {}}}}
    ) == {"object", "null"}


def _joined(name: str, *arguments: str, call_id: str | None = "call_a") -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": ""}}
    call["function"]["arguments"] = "".join(arguments)
    if call_id is not None:
        call["id"] = call_id
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_calls_run_together_in_one_call_are_split_not_repaired_into_one() -> None:
    """Two calls joined into one (a proxy that joins a stream's fragments by index when the
    server streamed both at index 0; LiteLLM's stream builder does): a JSON repair made the
    last of them the call and dropped the first. Each object is a call, in order."""
    report = _v().validate(_joined("search", '{"query": "oslo"}', ' {"query": "rome", "limit": 2}'))
    assert report.ok
    assert [(c.id, c.name, c.arguments) for c in report.tool_calls] == [
        ("call_a", "search", '{"query": "oslo"}'),
        ("call_a_1", "search", '{"query": "rome", "limit": 2}'),
    ]
    assert [r.kind for r in report.repairs] == ["split_calls"]
    # the names run together too (joined by index): each call gets its own tool back
    report = _v().validate(
        _joined("searchsend_email", '{"query": "x"}', '{"to": "a@b.c", "body": "hi"}')
    )
    assert report.ok
    assert [c.name for c in report.tool_calls] == ["search", "send_email"]


@pytest.mark.parametrize(
    "arguments",
    [
        '{"query": "oslo"} and {"query": "rome"}',  # words between: no run of objects
        '{"query": "oslo"}{"query": "rome"',  # the last one cut off
        '{"query": "oslo"}[1]',  # not an object
        '{"query": "a}{b"}',  # one object whose text holds "}{"
    ],
)
def test_arguments_that_are_no_run_of_objects_are_not_split(arguments: str) -> None:
    report = _v().validate(_joined("search", arguments))
    assert "split_calls" not in [r.kind for r in report.repairs]
    assert len(report.tool_calls) <= 1


def test_names_that_are_no_run_of_tools_are_not_split() -> None:
    """Two objects under a name that is not that many tools' names: not split (the name is
    judged as it is: an unknown tool)."""
    report = _v().validate(_joined("searchsearchsearch", '{"query": "a"}', '{"query": "b"}'))
    assert "split_calls" not in [r.kind for r in report.repairs]
    assert not report.ok


def test_at_most_so_many_calls_are_read_from_one() -> None:
    """A hostile run of a thousand ``{}``: not split into a thousand calls."""
    report = _v().validate(_joined("search", *["{}"] * 1000))
    assert "split_calls" not in [r.kind for r in report.repairs]


@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["search", "send_email", "run_terminal_command"]),
            st.dictionaries(st.sampled_from(["query", "to", "body", "command"]), st.text()),
        ),
        min_size=2,
        max_size=6,
    ),
    same_name=st.booleans(),
    spaces=st.sampled_from(["", " ", "\n"]),
)
def test_any_calls_run_together_come_back_as_those_calls(
    calls: list[tuple[str, dict[str, str]]], same_name: bool, spaces: str
) -> None:
    """Whatever the calls, their arguments' JSON texts run together under one call (its name
    one tool's, or the tools' names run together) come back as those calls, each argument
    text byte for byte, in order, a call repeated among them once; never more, never fewer."""
    if same_name:
        calls = [(calls[0][0], args) for _, args in calls]
    texts = [json.dumps(args) for _, args in calls]
    name = calls[0][0] if same_name else "".join(n for n, _ in calls)
    report = _v().validate(_joined(name, *(t + spaces for t in texts)))
    expected: list[tuple[str, str]] = []
    for (n, args), text in zip(calls, texts, strict=True):
        if (n, args) not in [(m, json.loads(t)) for m, t in expected]:
            expected.append((n, text))
    assert [(c.name, c.arguments) for c in report.tool_calls] == expected
    assert len({c.id for c in report.tool_calls}) == len(expected)


def test_a_call_whose_arguments_came_twice_is_one_call() -> None:
    """A stream that repeats a call's arguments at its end, joined by index: the same object
    twice is that call once (two would run the tool twice); among other calls, once too."""
    twice = '{"query": "oslo"}'
    report = _v().validate(_joined("search", twice, twice))
    assert [(c.id, c.arguments) for c in report.tool_calls] == [("call_a", twice)]
    assert [r.kind for r in report.repairs] == ["repeated_arguments"]
    other = '{"query": "rome"}'
    report = _v().validate(_joined("search", twice, other, twice))
    assert [c.arguments for c in report.tool_calls] == [twice, other]
    assert next(str(r) for r in report.repairs).endswith("'2 calls (repeats dropped)'")


def test_drop_keeps_a_misspelt_argument_an_error() -> None:
    """``drop`` removes an argument the tool does not take, but not a misspelling of one it
    takes and the call left out: ``limt`` would otherwise run the search on its default."""
    misspelt = Reply.call("search", {"query": "x", "limt": 5}).message()
    report = _v(unexpected_arguments="drop").validate(misspelt)
    assert not report.ok
    [error] = report.errors
    assert (error.kind, error.path, error.suggestions[0]) == (
        "unexpected_argument",
        "$.limt",
        "limit",
    )
    # beside the argument it resembles, it is no misspelling: dropped
    beside = Reply.call("search", {"query": "x", "limit": 5, "limt": 5}).message()
    dropped = _v(unexpected_arguments="drop").validate(beside)
    assert dropped.ok
    assert json.loads(dropped.tool_calls[0].arguments) == {"query": "x", "limit": 5}
    assert [r.kind for r in dropped.repairs] == ["dropped_argument"]
