"""Hand-written task files: TOML and JSONL load into Tasks; bad files get precise errors."""

from __future__ import annotations

import json

import pytest

from posttrain.tasks.files import TaskFileError, load_task_file, load_task_files


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_single_task(tmp_path):
    path = _write(tmp_path, "one.toml", 'domain = "math.add.d2"\nprompt = "37+48="\nreference = "85"\n')
    [task] = load_task_file(path)
    assert task.domain == "math.add.d2" and task.prompt == "37+48=" and task.reference == "85"
    assert task.split == "train" and task.key == f"math.add.d2/train/{task.hash[:12]}"


def test_toml_array_with_defaults(tmp_path):
    text = '''domain = "text.reverse.l3"
split = "eval"

[[tasks]]
prompt = "reverse abc="
reference = "cba"

[[tasks]]
prompt = "reverse xyz="
reference = {answer = "zyx"}
limits = {max_tokens = 8}
files = {"notes/a.txt" = "hello"}
'''
    a, b = load_task_file(_write(tmp_path, "many.toml", text))
    assert (a.domain, a.split, b.split) == ("text.reverse.l3", "eval", "eval")
    assert b.reference == {"answer": "zyx"} and b.limits.max_tokens == 8 and b.files == {"notes/a.txt": "hello"}
    assert a.key != b.key


def test_jsonl_roundtrip_of_generated_tasks(tmp_path):
    from posttrain.tasks.families import math as math_family

    tasks = [d.task(s, "eval") for d in math_family.domains()[:3] for s in range(2)]
    path = _write(tmp_path, "t.jsonl", "# generated\n" + "\n\n".join(t.model_dump_json() for t in tasks) + "\n")
    loaded = load_task_file(path)
    assert [t.model_dump_json() for t in loaded] == [t.model_dump_json() for t in tasks]
    assert [t.hash for t in loaded] == [t.hash for t in tasks]


def test_jsonl_errors_name_the_line_and_field(tmp_path):
    lines = [
        json.dumps({"domain": "math.add.d2", "prompt": "1+1=", "reference": "2"}),
        json.dumps({"domain": "math.add.d2", "reference": "2"}),
        '{"domain": "x.y", "prompt": ',
        json.dumps({"domain": "x.y", "prompt": "p", "limits": {"max_turns": "many"}, "colour": 1}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"domain": "x.y", "prompt": "p", "files": {"../etc/passwd": "x"}}),
    ]
    path = _write(tmp_path, "bad.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(TaskFileError) as info:
        load_task_file(path)
    msg = str(info.value)
    assert f"{path}:2: field 'prompt': Field required" in msg
    assert f"{path}:3: invalid JSON:" in msg
    assert f"{path}:4: field 'limits.max_turns': Input should be a valid integer" in msg and "'many'" in msg
    assert f"{path}:4: field 'colour': Extra inputs are not permitted" in msg
    assert f"{path}:5: expected a task object" in msg
    assert f"{path}:6: field 'files'" in msg and "relative" in msg
    assert f"{path}:1" not in msg  # the good line is fine


def test_toml_errors_name_the_table_line(tmp_path):
    text = 'domain = "math.add.d1"\n\n[[tasks]]\nprompt = "1+1="\n\n[[tasks]]\nreference = "3"\n'
    path = _write(tmp_path, "bad.toml", text)
    with pytest.raises(TaskFileError, match=r"bad\.toml:6 \(tasks\[1\]\): field 'prompt': Field required"):
        load_task_file(path)
    broken = _write(tmp_path, "broken.toml", 'domain = "x.y"\nprompt = \n')
    with pytest.raises(TaskFileError, match=r"broken\.toml: invalid TOML: .*line 2"):
        load_task_file(broken)


def test_duplicate_keys_unknown_types_empty_files_and_unknown_domains(tmp_path):
    row = json.dumps({"domain": "math.add.d2", "prompt": "1+1=", "reference": "2"})
    with pytest.raises(TaskFileError, match=r"dup\.jsonl:2: field 'key': .* already used at .*dup\.jsonl:1"):
        load_task_file(_write(tmp_path, "dup.jsonl", row + "\n" + row + "\n"))
    with pytest.raises(TaskFileError, match=r"unknown task file type '\.yaml'"):
        load_task_file(_write(tmp_path, "t.yaml", "a: 1"))
    with pytest.raises(TaskFileError, match="no tasks found"):
        load_task_file(_write(tmp_path, "empty.jsonl", "\n# nothing\n"))
    unknown = _write(tmp_path, "u.jsonl", json.dumps({"domain": "nosuch.domain", "prompt": "p"}) + "\n")
    assert load_task_file(unknown)[0].domain == "nosuch.domain"
    with pytest.raises(TaskFileError, match=r"u\.jsonl:1: field 'domain': unknown domain 'nosuch\.domain'"):
        load_task_file(unknown, require_known_domain=True)
    a = _write(tmp_path, "a.jsonl", row + "\n")
    b = _write(tmp_path, "b.json", json.dumps([json.loads(row)]))
    with pytest.raises(TaskFileError, match="already used in"):
        load_task_files([a, b])
    with pytest.raises(TaskFileError, match="cannot read"):
        load_task_file(tmp_path / "missing.jsonl")
