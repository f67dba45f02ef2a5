"""Hugging Face Transformers: ``Trainer(..., callbacks=[GpuscopeTrainerCallback(job="llm")])``.

Times every optimizer step, forwards what the Trainer logs (loss, learning rate, gradient norm)
and reports each checkpoint the Trainer saved, with its manifest. It sits beside ``report_to``
integrations such as W&B and MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gpuscope.sdk.run import Run, StepTimer

#: Trainer log keys -> gpuscope training metric names
_RENAME = {"loss": "loss", "learning_rate": "learning_rate", "grad_norm": "grad_norm"}


class GpuscopeTrainerCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Reports a Trainer run. Pass a ``run``, or ``gpuscope.init`` arguments to create one."""

    def __init__(self, run: Run | None = None, **init_kwargs: Any) -> None:
        self.run = run
        self._owned = run is None
        self._init_kwargs = init_kwargs
        self._timer: StepTimer | None = None

    def _require(self) -> Run:
        if self.run is None:
            raise RuntimeError("GpuscopeTrainerCallback used before on_train_begin")
        return self.run

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.run is None:
            from gpuscope.sdk import init

            placement = {
                "rank": args.process_index,
                "local_rank": args.local_process_index,
                "world_size": args.world_size,
            }
            self.run = init(**{**placement, **self._init_kwargs})

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._timer = self._require().step(int(state.global_step))
        self._timer.__enter__()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._timer is not None:
            self._timer.__exit__(None, None, None)
            self._timer = None

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        metrics = {
            name: float(logs[key])
            for key, name in _RENAME.items()
            if logs and isinstance(logs.get(key), int | float) and not isinstance(logs.get(key), bool)
        }
        if metrics and state.global_step > 0:
            self._require().log(max(0, int(state.global_step) - 1), **metrics)  # the step just finished

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        path = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"
        if args.should_save and path.is_dir():
            self._require().checkpoint_saved(int(state.global_step), path)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._owned and self.run is not None:
            self.run.finish()


__all__ = ["GpuscopeTrainerCallback"]
