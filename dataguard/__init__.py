"""dataguard: a data-quality pipeline for LLM fine-tuning data."""

import logging as _logging

__version__ = "0.1.0"

# transformers imports torchao (when installed, e.g. for `precision: fp8`) whenever it loads a
# model, and torchao logs a warning for every optional CUDA kernel it cannot load: on a CPU
# machine that is two lines of noise per process. Real torchao errors still show.
_logging.getLogger("torchao").setLevel(_logging.ERROR)
# ... and torchao's enums trip a deprecation notice in torch's pytree registry (torch 2.13)
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
