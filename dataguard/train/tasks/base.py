"""`Task`: the seam between the runner and one kind of training.

Why a class and not the string: ``task`` was a string tested in 23 places across 10 files, so a
third task (preference pairs) would have touched all of them. Everything that depends on the
task (how rows become examples, which model class is loaded, the loss and its weight mass,
what evaluation counts, what the dynamics record) is a method here; the rest of the runner is
the same for every task.

Tasks are stateless: the run's state (label map, offsets, class weights) is passed in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import torch

from dataguard.train.data.encoded import Encoded
from dataguard.train.optim.forward import ForwardOut


@dataclass
class EvalTally:
    """Sums of one evaluation, added batch by batch (and across processes): ``loss_sum`` over
    ``items`` (supervised tokens or rows, as the task counts its loss), ``correct`` of
    ``count`` predictions, and per class [correct, total] where the task has classes."""

    loss_sum: float = 0.0
    items: int = 0
    correct: int = 0
    count: int = 0
    per_class: dict[int, list[int]] = field(default_factory=dict)
    # further per-item sums a task reports as their mean over ``items`` (DPO's rewards)
    sums: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossSettings:
    """The train config's loss settings and the run's class tensors, as every forward needs them."""

    offsets: torch.Tensor | None = None
    logit_adjustment: bool = False
    label_smoothing: float = 0.0
    class_weights: torch.Tensor | None = None
    beta: float = 0.1  # a preference task's DPO temperature (``dpo_beta``)


class Task(ABC):
    """One kind of training (`dataguard.train.tasks.TASK_PATHS` names them)."""

    name: ClassVar[str]
    # peft's TaskType for the adapters
    lora_task_type: ClassVar[str]
    # a causal LM that generates (its built-in tiny model is ``tiny-causal-lm``) or a classifier
    generates: ClassVar[bool]
    # a label map, logit offsets, class weights and a class curriculum come from the shards
    has_classes: ClassVar[bool]
    # what a kept row is called in "no ... row left to train on"
    row_noun: ClassVar[str]
    # whether its examples fit the token cache (one sequence per row); else encoded each start
    token_cache: ClassVar[bool] = True

    def check_table(self, table: pa.Table, folder: Path) -> None:  # noqa: B027 (optional hook)
        """Refuse shards this task cannot train on (TrainDataError); called when they are opened."""

    @abstractmethod
    def auto_model_class(self) -> Any:
        """The transformers Auto class a trained folder of this task loads with."""

    @abstractmethod
    def from_pretrained(self, path: str, *, dtype: torch.dtype, quantization: Any,
                        id2label: dict[int, str]) -> Any:
        """The model of a Hugging Face folder, with this task's head."""

    @abstractmethod
    def max_length(self, configured: int | None, manifest: dict[str, Any], tokenizer: Any,
                   warn: Callable[[str], None], context: int | None) -> int | None:
        """The cut of an example in tokens: the config's, else what the task derives."""

    @abstractmethod
    def encode(self, table: pa.Table, tokenizer: Any, *, max_length: int | None, label_map: Any,
               allow_empty: bool) -> Encoded:
        """Rows -> tokenized examples (rows it cannot use are counted in ``Encoded.dropped``)."""

    @abstractmethod
    def weight_mass(self, batch: dict[str, torch.Tensor], class_weights: torch.Tensor | None) -> float:
        """A collated micro-batch's share of the step's loss denominator (THE WEIGHT RULE)."""

    @abstractmethod
    def forward(self, model: Any, batch: dict[str, torch.Tensor], settings: LossSettings, *,
                denominator: float | torch.Tensor | None = None,
                autocast: Callable[[], AbstractContextManager[Any]] | None = None) -> ForwardOut:
        """The step's forward: the micro-batch's share of the step loss and each row's loss."""

    @abstractmethod
    def eval_batch(self, model: Any, batch: dict[str, torch.Tensor], tally: EvalTally, settings: LossSettings) -> None:
        """Add one validation batch to ``tally`` (unweighted loss, accuracy)."""

    def dynamics_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The gold labels the dynamics recorder scores margins against (None: loss only)."""
        return None
