import pytest

from posttrain.envs.actions import check_args, parse_action


def names(text):
    return [(c.name, c.args) for c in parse_action(text).calls]


def test_tagged_calls_in_order():
    text = ('I will look.\n<bash>ls -la</bash>\n<write path="a.py">def f():\n    return 1\n</write>'
            '<read path="a.py"/><edit path="a.py"><old>1</old><new>2</new></edit><submit>done</submit>')
    assert names(text) == [("bash", {"command": "ls -la"}),
                           ("write_file", {"path": "a.py", "content": "def f():\n    return 1\n"}),
                           ("read_file", {"path": "a.py"}),
                           ("edit_file", {"path": "a.py", "old": "1", "new": "2"}),
                           ("submit", {"answer": "done"})]


def test_open_tag_at_end_is_closed_there():
    (call,) = parse_action("<bash>echo hi").calls
    assert call.name == "bash" and call.args == {"command": "echo hi"} and call.unclosed


def test_openai_style_calls():
    assert names('{"name": "bash", "arguments": {"command": "ls"}}') == [("bash", {"command": "ls"})]
    assert names('<tool_call>{"name": "submit", "arguments": "{\\"answer\\": \\"7\\"}"}</tool_call>') == \
        [("submit", {"answer": "7"})]
    assert names('[{"name": "read_file", "arguments": {"path": "x"}}, {"name": "submit", "arguments": {}}]') == \
        [("read_file", {"path": "x"}), ("submit", {})]
    assert names('{"type": "function", "function": {"name": "python", "arguments": {"code": "1"}}}') == \
        [("python", {"code": "1"})]


def test_domain_tool():
    assert names('<tool name="model">box(1, 2, 3)</tool>') == [("model", {"input": "box(1, 2, 3)"})]


@pytest.mark.parametrize("text,fragment", [
    ('{"name": 5}', "string \"name\""),
    ('{"name": "bash", "arguments": "{not json"}', "not valid JSON"),
    ('<tool_call>{"name": "bash", </tool_call>', "could not parse"),
    ('<edit path="a"><new>x</new></edit>', "<old>"),
])
def test_malformed_calls_are_reported(text, fragment):
    parsed = parse_action(text)
    assert parsed.calls == [] and any(fragment in e for e in parsed.errors), parsed.errors


def test_no_call_and_missing_args():
    assert parse_action("just words").calls == [] and parse_action("just words").errors == []
    (call,) = parse_action('{"name": "bash", "arguments": {}}').calls
    assert "command" in check_args(call)
