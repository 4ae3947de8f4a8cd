"""eval.py's data (``datamodules.EvalCorpus``) reads local files by training's rules (issue #47): a file cut mid-line
is an error naming the file and line, skipped records are counted by cause and reported, and data with nothing usable
says why, one message per cause (before: 4 documents of 5 without a word, or "no test document has at least N
tokens" for every kind of bad file)."""
import json
import logging

import pytest

from _dm_helpers import make_docs, write_jsonl
from datamodules import EvalCorpus
from datamodules.sources import CorruptDataError, describe_skips, file_records

DOCS = make_docs(5, seed=1, min_words=300, max_words=400)


def cut_jsonl(tmp_path):
    path = tmp_path / "test.jsonl"
    data = "".join(json.dumps({"text": d}) + "\n" for d in DOCS).encode()
    path.write_bytes(data[: len(data) - 40])  # the 5th record loses its end
    return path


def test_a_jsonl_cut_mid_line_is_an_error_naming_the_file_and_line(tmp_path):
    path = cut_jsonl(tmp_path)
    corpus = EvalCorpus(str(path))
    for read in (lambda: corpus.long_documents(64, 2, None), lambda: corpus.texts(None),
                 lambda: list(corpus.test_sequences(16, 2, None))):
        with pytest.raises(CorruptDataError, match=rf"^{path}: line 5 is cut off \(the file ends inside a record; "
                                                   r"lines 1-4 were read\); re-download or rebuild the file$"):
            read()
    # training reads the same file by the same rule: the records before the cut, then the error
    records = file_records(str(path), "text")
    assert [next(records) for _ in range(4)] == [(d, None) for d in DOCS[:4]]
    with pytest.raises(CorruptDataError, match="line 5 is cut off"):
        next(records)


def test_a_last_line_without_newline_that_parses_is_a_record_and_a_bad_line_inside_is_a_skip(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_bytes(b'{"text": "one"}\n{broken\n{"text": "two"}')
    assert list(file_records(str(path), "text")) == [("one", None), (None, "invalid_json"), ("two", None)]


def test_skipped_records_are_counted_by_cause_and_reported(tmp_path, caplog):
    write_jsonl(tmp_path / "test.jsonl", [{"text": d} for d in DOCS[:3]] + [
        b"\xff\xfe not utf-8\n", {"body": "x"}, {"body": "y"}, {"text": ""}])
    corpus = EvalCorpus(str(tmp_path / "test.jsonl"))
    with caplog.at_level(logging.WARNING, logger="datamodules"):
        docs = corpus.long_documents(64, 2, None)
        corpus.long_documents(64, 2, None)  # a second read reports nothing new
    assert len(docs) == 3
    assert corpus.describe()["skipped_records"] == {"missing_field": 2, "invalid_utf8": 1, "empty_text": 1}
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warned == [f"eval data {tmp_path / 'test.jsonl'}: skipped 2 records: no 'text' field; 1 record: an empty "
                      f"'text'; 1 record: not UTF-8 text (a binary or otherwise encoded file?)"]


@pytest.mark.parametrize("content, cause", [
    (b"\xff\xfe\x00\x01 garbage\n" * 3, "3 records: not UTF-8 text (a binary or otherwise encoded file?)"),
    (b'{"body": "a"}\n{"body": "b"}\n', "2 records: no 'text' field"),
    (b"", "1 file: an empty file"),
    (b"plain prose, not json\n", "1 record: not a JSON object on one line (is the file JSON Lines?)"),
])
def test_data_with_nothing_usable_names_its_cause(tmp_path, content, cause):
    (tmp_path / "test.jsonl").write_bytes(content)
    corpus = EvalCorpus(str(tmp_path / "test.jsonl"))
    for read in (lambda: corpus.long_documents(1025, 1025, None), lambda: corpus.texts(3)):
        with pytest.raises(ValueError) as info:
            read()
        message = str(info.value)
        assert f"no usable test document in {tmp_path / 'test.jsonl'}: every record was skipped: {cause} (" in message
        assert "has at least" not in message


def test_documents_that_are_only_short_say_so(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [{"text": "a few words"}] * 2)
    with pytest.raises(ValueError, match=r"has at least 1025 tokens \(2 documents read, all shorter\)"):
        EvalCorpus(str(tmp_path / "test.jsonl")).long_documents(1025, 1025, None)


def test_describe_skips_orders_by_count_and_explains_each_cause():
    assert describe_skips({}, "text") == "none"
    assert describe_skips({"empty_file": 2, "missing_field": 5, "not_text": 1}, "body") == (
        "5 records: no 'body' field; 2 files: an empty file; 1 record: a 'body' that is not a string")
