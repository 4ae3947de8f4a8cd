"""The callbacks' statistics reach every attached logger: a tiny CPU fit with TensorBoard and W&B (offline mode), read
back from the files each one writes (TensorBoard's event file; W&B's run-<id>.wandb transaction log and its media).

Skipped without wandb (the optional ``.[wandb]`` extra; CI installs ``.[dev]``, which does not include it)."""
import json
import struct

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import HeadSurvivalCallback, LongContextLossCallback
from test_callbacks_fit import TinyData, tiny_model  # (this folder is on sys.path under pytest)

import wandb  # noqa: E402  in the dev extra: a broken install fails here rather than skips
from lightning.pytorch.loggers import WandbLogger  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

BLOCK, HEADER = 32768, 7  # W&B's transaction log is LevelDB's log format: 32 KiB blocks, 7-byte record headers


def wandb_history(path) -> list[dict]:
    """The history rows (``run.log`` calls) of an offline run's ``.wandb`` file: a 7-byte file header (":W&B", magic,
    version), then records (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) of serialized ``Record``s."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    rows, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if left < HEADER or (length == 0 and kind == 0):  # block trailer padding
            pos += left
            continue
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_head_and_long_context_statistics_reach_tensorboard_and_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tensorboard = TensorBoardLogger(tmp_path, name="run")
    wandb_logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="fpa-test")
    trainer = L.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=1, logger=[tensorboard, wandb_logger],
                        callbacks=[HeadSurvivalCallback(every_n_steps=2),
                                   LongContextLossCallback(context_multiple=4, n_documents=2, min_tokens=2)],
                        accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(tiny_model(), datamodule=TinyData())
    wandb.finish()

    tensorboard.experiment.flush()
    events = EventAccumulator(tensorboard.log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tb_scalars, tb_images = set(events.Tags()["scalars"]), set(events.Tags()["images"])

    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows = wandb_history(log)
    by_key: dict[str, list] = {}
    for row in rows:
        for key, value in row.items():
            by_key.setdefault(key, []).append((row.get("trainer/global_step"), value))

    statistics = ["heads/alive_fraction/layer_01/head_00", "heads/alive_fraction/layer_01/head_01",
                  "heads/boundary_ratio/layer_01/head_00", "heads/summary/median_alive_fraction",
                  "heads/summary/heads_with_bias", "long_context/loss/pos_000",
                  "long_context/summary/within_context", "long_context/summary/beyond_context"]
    for tag in statistics:
        assert tag in tb_scalars, tag
        assert tag in by_key, tag
        # the same values at the same steps in both
        assert [step for step, _ in by_key[tag]] == [e.step for e in events.Scalars(tag)] == [2, 4], tag
        assert [v for _, v in by_key[tag]] == pytest.approx([e.value for e in events.Scalars(tag)], rel=1e-6), tag
    for tag in ("heads/image/alive_fraction_map", "heads/image/example_bias", "long_context/image/loss_vs_position"):
        assert tag in tb_images, tag
        images = [value for _, value in by_key[f"{tag}/filenames"]]
        assert len(images) == 2, tag  # steps 2 and 4
        for names in images:
            (name,) = names
            assert (log.parent / "files" / name).stat().st_size > 1000  # a real PNG of the drawn figure
