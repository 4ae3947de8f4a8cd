"""Data integrity (issue #23): truncated compressed files, the resume fingerprint of the data, checked sizes, the
tokenizer file message, and a hub probe that leaves os.environ alone."""
import itertools
import json
import os
import shutil

import pytest
import torch
import zstandard

from _dm_helpers import make_docs, write_jsonl
from datamodules import TextDataModule, mistral_tokenizer
from datamodules.sources import CorruptDataError, HubUnavailableError, file_records, require_hub
from datamodules.text import DataChangedError


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def dm_for(folder, **kw):
    return TextDataModule(source=str(folder), **{"seq_len": 32, "batch_size": 4, "num_workers": 0, **kw})


RECORDS = [{"text": f"record {i} " + "word " * (i % 50)} for i in range(2000)]


# ------------------------------------------------------------------------------------------- truncated files


@pytest.mark.parametrize("compress", ["zst", "gz"])
def test_a_truncated_compressed_file_is_an_error_naming_the_file_and_line(tmp_path, compress):
    """Cut to 50 %: before, .zst gave a shorter stream without error and .gz a raw EOFError traceback."""
    full = write_jsonl(tmp_path / f"full.jsonl.{compress}", RECORDS, compress)
    assert [text for text, _ in file_records(str(full), "text")] == [r["text"] for r in RECORDS]
    cut = tmp_path / f"cut.jsonl.{compress}"
    data = full.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    read = []
    with pytest.raises(CorruptDataError, match=rf"{cut}: truncated or corrupt") as info:
        for record in file_records(str(cut), "text"):
            read.append(record)
    # the records before the cut are intact, none is invented or half-read, and the message names where it stopped
    assert 0 < len(read) < len(RECORDS)
    assert read == [(r["text"], None) for r in RECORDS[: len(read)]]
    assert f"after line {len(read)} " in str(info.value)


def test_corrupt_zstd_bytes_and_multi_frame_files(tmp_path):
    one = zstandard.ZstdCompressor().compress(b"".join((json.dumps(r) + "\n").encode() for r in RECORDS[:10]))
    two = zstandard.ZstdCompressor().compress(b'{"text": "last, without a newline"}')
    (tmp_path / "frames.jsonl.zst").write_bytes(one + two)  # concatenated frames (pzstd, appended files) are one file
    assert [t for t, _ in file_records(str(tmp_path / "frames.jsonl.zst"), "text")] == (
        [r["text"] for r in RECORDS[:10]] + ["last, without a newline"])
    (tmp_path / "junk.jsonl.zst").write_bytes(one + b"trailing junk")  # not a frame: an error, after 10 lines
    with pytest.raises(CorruptDataError, match="junk.jsonl.zst: truncated or corrupt zstd data after line 10 "):
        list(file_records(str(tmp_path / "junk.jsonl.zst"), "text"))
    # a flipped byte is detectable where the frame has a checksum (zstd -C, the default of the zstd command line)
    checked = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(b"".join(
        (json.dumps(r) + "\n").encode() for r in RECORDS[:10])))
    checked[len(checked) // 2] ^= 0xFF
    (tmp_path / "flipped.jsonl.zst").write_bytes(bytes(checked))
    with pytest.raises(CorruptDataError, match="flipped.jsonl.zst: truncated or corrupt zstd data"):
        list(file_records(str(tmp_path / "flipped.jsonl.zst"), "text"))
    (tmp_path / "junk.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CorruptDataError, match="junk.jsonl.gz: truncated or corrupt gzip data after line 0"):
        list(file_records(str(tmp_path / "junk.jsonl.gz"), "text"))


def test_a_truncated_file_stops_the_packed_stream(tmp_path):
    data = zstandard.ZstdCompressor().compress(b"".join((json.dumps({"text": t}) + "\n").encode()
                                                        for t in make_docs(200, seed=3)))
    (tmp_path / "validation.jsonl.zst").write_bytes(data[: len(data) * 3 // 4])
    with pytest.raises(CorruptDataError, match="validation.jsonl.zst"):
        list(dm_for(tmp_path).val_dataloader())


# ------------------------------------------------------------------------------------------- resume fingerprint


@pytest.fixture
def data(tmp_path):
    docs = make_docs(60, seed=1, max_words=120)
    for i in range(3):
        write_jsonl(tmp_path / "a" / "train" / f"part{i}.jsonl", [{"text": t, "body": t.upper()} for t in docs[i::3]])
    write_jsonl(tmp_path / "a" / "val.jsonl", [{"text": t} for t in make_docs(20, seed=2)])
    write_jsonl(tmp_path / "a" / "test.jsonl", [{"text": t} for t in make_docs(20, seed=3)])
    return tmp_path


def saved_state(folder, **kw) -> dict:
    dm = dm_for(folder, **kw)
    take(dm.train_dataloader(), 5)
    return json.loads(json.dumps(dm.state_dict()))  # as it travels through a checkpoint


def test_the_fingerprint_names_the_files_text_field_and_tokenizer(data):
    fingerprint = saved_state(data / "a")["config"]["data"]
    sizes = [os.path.getsize(data / "a" / "train" / f"part{i}.jsonl") for i in range(3)]
    assert fingerprint["train"]["files"] == [[f"part{i}.jsonl", sizes[i]] for i in range(3)]
    assert fingerprint["train"]["count"] == 3 and fingerprint["train"]["bytes"] == sum(sizes)
    assert fingerprint["text_field"] == "text"
    assert len(fingerprint["tokenizer_sha256"]) == 16


def test_resume_on_an_added_file_is_refused_showing_it_and_accepted_with_the_override(data):
    state = saved_state(data / "a")
    write_jsonl(data / "a" / "train" / "part3.jsonl", [{"text": t} for t in make_docs(5, seed=7)])
    with pytest.raises(DataChangedError, match=r"train files 3 files / \d+ bytes -> 4 files / \d+ bytes "
                                               r"\(added: part3\.jsonl\).*allow_data_change=true"):
        dm_for(data / "a").load_state_dict(state)
    allowed = dm_for(data / "a", allow_data_change=True)
    with pytest.warns(UserWarning, match=r"resuming on changed data .*added: part3\.jsonl"):
        allowed.load_state_dict(state)
    assert allowed._train_consumed == 5  # the position was restored


def test_resume_on_another_folder_is_refused_unless_it_holds_the_same_files(data):
    state = saved_state(data / "a")
    shutil.copytree(data / "a", data / "copy")
    dm_for(data / "copy").load_state_dict(state)  # the same files elsewhere: the same data, accepted
    docs = make_docs(60, seed=11, max_words=120)  # another folder with other data under the same names
    for i in range(3):
        write_jsonl(data / "b" / "train" / f"part{i}.jsonl", [{"text": t} for t in docs[i::3]])
    shutil.copy(data / "a" / "val.jsonl", data / "b")
    shutil.copy(data / "a" / "test.jsonl", data / "b")
    with pytest.raises(DataChangedError, match=r"size changed: part0\.jsonl, part1\.jsonl, part2\.jsonl"):
        dm_for(data / "b").load_state_dict(state)


def test_resume_with_another_text_field_or_tokenizer_is_refused(data, tmp_path):
    state = saved_state(data / "a")
    with pytest.raises(DataChangedError, match="text_field 'text' -> 'body'"):
        dm_for(data / "a", text_field="body").load_state_dict(state)
    other = mistral_tokenizer()
    other.add_tokens(["<extra_token>"])
    other.save(str(tmp_path / "other_tokenizer.json"))
    with pytest.raises(DataChangedError, match=r"tokenizer \(sha256 of its JSON\) [0-9a-f]{16} -> [0-9a-f]{16} "
                                               r"\(tokenizer='.*other_tokenizer\.json'\)"):
        dm_for(data / "a", tokenizer=str(tmp_path / "other_tokenizer.json")).load_state_dict(state)


def test_a_hub_split_change_is_refused():
    current = {"train": {"hub_id": "org/data", "hub_split": "train", "hub_data_files": None},
               "text_field": "text", "tokenizer_sha256": "0" * 16}
    dm = TextDataModule(num_workers=0)
    dm._fingerprint = current
    saved = {"config": {**dm._resume_config(), "data": {**current, "train": {**current["train"], "hub_split": "x"}}},
             "world_size": None, "ranks": [{"rank": 0, "consumed": 0, "cursors": [None], "stats": {}}]}
    with pytest.raises(DataChangedError, match="train source hub 'org/data' split 'x' -> hub 'org/data' split 'train'"):
        dm.load_state_dict(saved)


def test_resume_on_the_same_data_continues_exactly(data):
    straight = take(dm_for(data / "a").train_dataloader(), 9)
    state = saved_state(data / "a")
    second = dm_for(data / "a")
    second.load_state_dict(state)
    tail = take(second.train_dataloader(), 4)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(straight[5:], tail))


def test_outside_fit_the_train_position_is_not_restored_nor_checked(data):
    """`train.py test --ckpt_path` on other data must not be refused: the train stream plays no part there."""
    import lightning as L

    state = saved_state(data / "a")
    dm = dm_for(data / "a", text_field="body")
    dm.trainer = L.Trainer(logger=False, accelerator="cpu")
    dm.trainer.state.fn = "test"
    dm.load_state_dict(state)
    assert dm._train_consumed == 0


def test_the_last_consumed_train_batch_has_a_position(data):
    dm = dm_for(data / "a")
    take(dm.train_dataloader(), 3)
    position = dm.last_train_batch
    assert (position.batch, position.rank, position.worker) == (3, 0, 0)
    assert position.end == tuple(dm.state_dict()["ranks"][0]["cursors"][0])
    assert str(position).startswith("train batch 3 of rank 0 (logical worker 0: from [pass 0, document ")


# ------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("kwargs, message", [
    ({"val_batch_size": 0}, "val_batch_size must be >= 1"),
    ({"val_batch_size": -2}, "val_batch_size must be >= 1"),
    ({"max_val_batches": 0}, "max_val_batches must be >= 1"),
    ({"max_val_batches": -1}, "max_val_batches must be >= 1"),
])
def test_validation_sizes_must_be_positive(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextDataModule(**kwargs)


def test_validation_sizes_default_and_apply():
    dm = TextDataModule(batch_size=3, max_val_batches=None)
    assert (dm.val_batch_size, dm.max_val_batches) == (3, None)
    assert TextDataModule(batch_size=3, val_batch_size=5).val_batch_size == 5


def test_a_tokenizer_file_that_is_not_json_names_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("this is not json\n")
    with pytest.raises(ValueError) as info:
        mistral_tokenizer(str(bad))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"tokenizer file '{bad}' is not a valid tokenizer.json (")
    assert "Tokenizer.save" in message and "tokenizer=None" in message


def test_the_hub_probe_leaves_the_environment_alone(monkeypatch):
    from datamodules import sources

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sources, "_hub_reachable", lambda *args, **kwargs: False)
    before = dict(os.environ)
    with pytest.raises(HubUnavailableError, match="no network"):
        require_hub("org/data", what="data set", local_hint="-")
    assert dict(os.environ) == before

