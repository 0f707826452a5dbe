"""The stream Accumulator reads whatever deltas the raw client reads (issue 15).

Property: any sequence of chunks, whatever their tool-call fragments hold (no ``index``, an
``index`` that is text, arguments or a name that are not text, fragments that are not objects),
assembles into one message without raising; well-formed fragments assemble as before.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentguard.guard._stream import Accumulator
from agentguard.transport import StreamChunk

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=6)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
fragments = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.one_of(st.integers(0, 3), scalars),
            "id": st.one_of(st.sampled_from(["c1", "c2"]), scalars),
            "function": st.one_of(
                st.fixed_dictionaries({}, optional={"name": values, "arguments": values}), values
            ),
            "type": st.one_of(st.sampled_from(["function", "custom", "id"]), scalars),
            "custom": st.one_of(
                st.fixed_dictionaries({}, optional={"name": values, "input": values}), values
            ),
        },
    ),
    values,
)
chunks = st.builds(
    lambda content, calls, finish: StreamChunk(
        content=content, tool_calls=calls, finish_reason=finish
    ),
    st.one_of(st.none(), st.text(max_size=5), values),
    st.one_of(st.lists(fragments, max_size=3), values),
    st.sampled_from([None, "stop", "tool_calls"]),
)


@settings(max_examples=400, deadline=None)
@given(stream=st.lists(chunks, max_size=8))
def test_any_chunks_assemble_into_a_message(stream: list[Any]) -> None:
    """Every function call slot has text fields, a call of another kind (a custom tool's) none;
    the content is text."""
    acc = Accumulator()
    for chunk in stream:
        acc.add(chunk)
    message = acc.response().message
    assert message["content"] is None or isinstance(message["content"], str)
    for call in message.get("tool_calls") or ():
        assert call["id"] is None or isinstance(call["id"], str)
        if call["type"] != "function":  # its own object, as sent (the raw client's reading)
            assert "function" not in call
            continue
        assert isinstance(call["function"]["name"], str)
        assert isinstance(call["function"]["arguments"], str)


def test_a_custom_tools_call_assembles_as_one_with_its_input_joined() -> None:
    """GPT-5's custom tools stream a call of another kind: kept so (it was a function call
    named '', re-asked as a hallucinated tool), its ``input`` joined as streamed."""
    acc = Accumulator()
    for fragment in (
        {"index": 0, "id": "c1", "type": "custom", "custom": {"name": "run", "input": ""}},
        {"index": 0, "custom": {"input": "print("}},
        {"index": 0, "custom": {"input": "'hi')"}},
        {"index": 1, "id": "f1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    ):
        acc.add(StreamChunk(tool_calls=[fragment]))
    assert acc.response().message["tool_calls"] == [
        {"id": "c1", "type": "custom", "custom": {"name": "run", "input": "print('hi')"}},
        {"id": "f1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    ]


def _delta(index: Any = ..., call_id: Any = None, name: Any = None, args: Any = None) -> Any:
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    fragment: dict[str, Any] = {"function": fn}
    if call_id is not None:
        fragment["id"] = call_id
    if index is not ...:
        fragment["index"] = index
    return StreamChunk(tool_calls=[fragment])


def test_fragments_without_an_index_continue_the_call_or_start_the_next() -> None:
    """No ``index``: a fragment continues the last call, or starts one with a new ``id``."""
    acc = Accumulator()
    for chunk in (
        _delta(call_id="c1", name="read_file", args='{"pa'),
        _delta(args='th": "a"}'),
        _delta(call_id="c2", name="wipe", args="{}"),
    ):
        acc.add(chunk)
    calls = acc.response().message["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("c1", "read_file", '{"path": "a"}'),
        ("c2", "wipe", "{}"),
    ]


def test_arguments_sent_as_an_object_become_their_json_text() -> None:
    """Arguments as an object (a server that skips encoding): their JSON text."""
    acc = Accumulator()
    acc.add(_delta(0, "c1", "read_file", {"path": "a"}))
    call = acc.response().message["tool_calls"][0]
    assert call["function"]["arguments"] == '{"path":"a"}'


def test_well_formed_fragments_assemble_by_index() -> None:
    """The usual stream: fragments joined by their index, in index order."""
    acc = Accumulator()
    acc.add(_delta(1, "b", "second", "{}"))
    acc.add(_delta(0, "a", "first", '{"x"'))
    acc.add(_delta(0, args=": 1}"))
    calls = acc.response().message["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"x": 1}', "{}"]


def _calls(acc: Accumulator) -> list[tuple[Any, Any, Any]]:
    calls = acc.response().message.get("tool_calls") or []
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_parallel_calls_streamed_at_one_index_stay_apart() -> None:
    """Ollama streams every parallel call at index 0 (ollama/ollama#15457), each whole or in
    fragments after its opening one: a fragment with a new id and a name opens the next call;
    fragments after it continue that one. Read by index alone they were one call named
    ``get_weatherget_weather`` with two JSON objects run together."""
    acc = Accumulator()
    for chunk in (
        _delta(0, "call_a", "get_weather", '{"city": "Oslo"}'),
        _delta(0, "call_b", "get_weather", '{"city": '),
        _delta(0, args='"Rome"}'),
        _delta(0, "call_c", "get_time", "{}"),
    ):
        acc.add(chunk)
    assert _calls(acc) == [
        ("call_a", "get_weather", '{"city": "Oslo"}'),
        ("call_b", "get_weather", '{"city": "Rome"}'),
        ("call_c", "get_time", "{}"),
    ]
    assert acc.split == 2


def test_a_new_id_without_a_name_continues_the_call() -> None:
    """A fragment that only brings arguments continues its call whatever its ``id`` (a server
    that sends an id with every fragment): only a fragment that names a call opens one."""
    acc = Accumulator()
    acc.add(_delta(0, "call_a", "get_weather", '{"city": '))
    acc.add(_delta(0, "call_x", args='"Oslo"}'))
    assert _calls(acc) == [("call_x", "get_weather", '{"city": "Oslo"}')]
    assert acc.split == 0
    # the id repeated with the name on every fragment: one call
    acc = Accumulator()
    acc.add(_delta(0, "call_a", "get_weather", '{"city": '))
    acc.add(_delta(0, "call_a", args='"Oslo"}'))
    assert _calls(acc) == [("call_a", "get_weather", '{"city": "Oslo"}')]
    assert acc.split == 0


@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["get_weather", "get_time", "read_file"]),
            st.text(max_size=12),
            st.integers(1, 4),
        ),
        min_size=1,
        max_size=5,
    ),
    at_one_index=st.booleans(),
)
def test_calls_come_back_as_streamed_at_one_index_or_at_their_own(
    calls: list[tuple[str, str, int]], at_one_index: bool
) -> None:
    """Whatever the calls and however their arguments are cut, streamed at index 0 each
    (Ollama) or at an index each (OpenAI), the calls assembled are the calls sent, in order."""
    acc = Accumulator()
    for n, (name, arguments, pieces) in enumerate(calls):
        index = 0 if at_one_index else n
        cut = max(1, len(arguments) // pieces)
        parts = [arguments[i : i + cut] for i in range(0, len(arguments), cut)] or [""]
        acc.add(_delta(index, f"call_{n}", name, parts[0]))
        for part in parts[1:]:
            acc.add(_delta(index, args=part))
    assert _calls(acc) == [(f"call_{n}", name, args) for n, (name, args, _) in enumerate(calls)]
    assert acc.split == (len(calls) - 1 if at_one_index else 0)
