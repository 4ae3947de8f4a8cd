"""eval.py --data by training's reader rules, end to end (issue #47): a .jsonl cut mid-line is one error line naming
the file and line (it used to exit 0 with 4 documents of 5), and skipped records are reported by cause on stderr and
in the result's data header."""
import json
import logging

import pytest

from eval import main

DOC = "And God said, Let there be light: and there was light. " * 20  # ~300 tokens


def write(path, lines: list[bytes]):
    path.write_bytes(b"".join(lines))
    return path


def test_a_truncated_jsonl_is_one_error_line_naming_the_line(tmp_path, ckpts, capsys):
    records = [(json.dumps({"text": f"{i} {DOC}"}) + "\n").encode() for i in range(5)]
    data = write(tmp_path / "test.jsonl", records[:4] + [records[4][:-30]])
    with pytest.raises(SystemExit) as exc:
        main(["--task", "pg19_long", "--ckpt", ckpts["fpa"], "--data", str(data), "--max-len", "64",
              "--out", str(tmp_path / "out"), "--n-boot", "200"])
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert lines == [f"eval.py: error: --task pg19_long: {data}: line 5 is cut off (the file ends inside a record; "
                     f"lines 1-4 were read); re-download or rebuild the file"]
    assert not (tmp_path / "out").exists()


def test_skipped_records_are_reported_by_cause(tmp_path, ckpts, caplog):
    """On stderr through logging (Python's last-resort handler prints a warning when nothing is configured; pytest
    captures it in caplog)."""
    good = [(json.dumps({"text": f"{i} {DOC}"}) + "\n").encode() for i in range(3)]
    data = write(tmp_path / "test.jsonl", good + [b"\xff\xfe binary\n", b'{"body": "x"}\n'])
    path = main(["--task", "pg19_long", "--ckpt", ckpts["fpa"], "--data", str(data), "--max-len", "64",
                 "--out", str(tmp_path / "out"), "--n-boot", "200"])
    with open(path) as f:
        record = json.load(f)
    assert record["data"]["skipped_records"] == {"invalid_utf8": 1, "missing_field": 1}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "skipped" in r.getMessage()] == [
        f"eval data {data}: skipped 1 record: not UTF-8 text (a binary or otherwise encoded file?); 1 record: no "
        f"'text' field"]
