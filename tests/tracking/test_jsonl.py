"""The one .jsonl reader (zkl/tracking/jsonl.py) and what its three callers make of it."""

from zkl.tracking.jsonl import NOT_JSON, read_jsonl


def test_lines_blank_damage_and_a_torn_tail(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"step": 0}\n\n[1]\n{"ste\n\xff\n{"step": 1}\n{"step": 2')
    read = read_jsonl(path)
    assert [line.number for line in read.lines] == [1, 3, 4, 5, 6]
    assert [line.is_object for line in read.lines] == [True, False, False, False, True]
    assert read.lines[2].record is NOT_JSON and read.lines[3].record is NOT_JSON
    assert read.blank == 1
    assert read.torn is not None and read.torn.number == 7 and read.torn.record is NOT_JSON
    path.write_text('{"step": 0}\n{"step": 1}')  # whole, only the newline missing
    assert read_jsonl(path).torn.record == {"step": 1}
    assert read_jsonl(tmp_path / "absent.jsonl").lines == []
