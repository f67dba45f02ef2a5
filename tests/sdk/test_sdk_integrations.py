"""The Lightning callback and the Transformers TrainerCallback, each in a real (tiny) CPU trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuscope.web.server import HubServer
from sdk.hubquery import events, records

torch = pytest.importorskip("torch")


def _data(n: int = 64) -> Any:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=gen)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def test_lightning_callback(tmp_path: Path, local_hub: HubServer) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from gpuscope.sdk.integrations.lightning import GpuscopeCallback

    class Tiny(lightning.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = GpuscopeCallback(job="pl-job", hub=local_hub.url, state_dir=tmp_path / "state")
    trainer = lightning.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        callbacks=[callback, lightning.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(_data(), batch_size=8))
    rows = records(local_hub.url, "pl-job")
    assert [r["step"] for r in rows] == list(range(6))
    assert all(r["metrics"]["loss"] > 0 and r["metrics"]["step_seconds"] > 0 for r in rows)
    saved = events(local_hub.url, "pl-job", "checkpoint_completed")
    assert len(saved) == 1 and saved[0]["data"]["bytes"] > 0
    assert events(local_hub.url, "pl-job", "job_ended")


def test_transformers_callback(tmp_path: Path, local_hub: HubServer) -> None:
    transformers = pytest.importorskip("transformers")
    from gpuscope.sdk.integrations.transformers import GpuscopeTrainerCallback

    class Tiny(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    class Rows(torch.utils.data.Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            self.inner = _data()

        def __len__(self) -> int:
            return len(self.inner)

        def __getitem__(self, i: int) -> dict[str, Any]:
            x, y = self.inner[i]
            return {"x": x, "labels": y}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=8,
        logging_steps=1,
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = GpuscopeTrainerCallback(job="hf-job", hub=local_hub.url, state_dir=tmp_path / "state")
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=Rows(), callbacks=[callback])
    trainer.train()
    rows = records(local_hub.url, "hf-job")
    assert [r["step"] for r in rows] == list(range(6))
    assert all(r["metrics"]["step_seconds"] > 0 and "loss" in r["metrics"] for r in rows)
    assert all("learning_rate" in r["metrics"] for r in rows)
    saved = events(local_hub.url, "hf-job", "checkpoint_completed")
    assert sorted(e["data"]["step"] for e in saved) == [3, 6]
    assert all(e["data"]["files"] >= 1 for e in saved)
