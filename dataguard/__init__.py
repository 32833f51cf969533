"""dataguard: a data-quality pipeline for LLM fine-tuning data."""

__version__ = "0.1.0"
