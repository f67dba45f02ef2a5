"""PyTorch Lightning: ``Trainer(callbacks=[GpuscopeCallback(job="llm")])``.

Times every training batch as a step, reports its loss (a tensor, turned into a number on the
SDK's thread, so no device sync in the loop), and reports checkpoints Lightning saved. It is an
ordinary callback, so it runs beside Lightning's W&B or MLflow loggers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from gpuscope.sdk.run import Run, StepTimer


class GpuscopeCallback(Callback):
    """Reports a Lightning run. Pass a ``run``, or ``gpuscope.init`` arguments to create one."""

    def __init__(self, run: Run | None = None, **init_kwargs: Any) -> None:
        super().__init__()
        self.run = run
        self._owned = run is None
        self._init_kwargs = init_kwargs
        self._timer: StepTimer | None = None
        self._saved: set[str] = set()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.run is None:
            from gpuscope.sdk import init

            kwargs = {"rank": trainer.global_rank, "world_size": trainer.world_size, **self._init_kwargs}
            self.run = init(**kwargs)

    def _require(self) -> Run:
        if self.run is None:
            raise RuntimeError("GpuscopeCallback used before setup(): is it in Trainer(callbacks=[...])?")
        return self.run

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._timer = self._require().step(int(trainer.global_step))
        self._timer.__enter__()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        run, timer = self._require(), self._timer
        if timer is None:
            return
        timer.__exit__(None, None, None)
        self._timer = None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            run.log(timer.step, loss=loss.detach() if hasattr(loss, "detach") else loss)
        self._report_checkpoints(trainer, timer.step)

    def _report_checkpoints(self, trainer: Trainer, step: int) -> None:
        for cb in trainer.checkpoint_callbacks:
            path = getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")
            if path and path not in self._saved and Path(path).is_file():
                self._saved.add(path)
                self._require().checkpoint_saved(step, path)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report_checkpoints(trainer, int(trainer.global_step))
        if self._owned and self.run is not None:
            self.run.finish()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._owned and self.run is not None:
            self.run.crashed(exception)
