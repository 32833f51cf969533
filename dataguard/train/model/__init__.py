"""The network: loading a model (a local folder or a built-in name), its base dtype (fp32, bf16,
4-bit), LoRA, the parameter groups the optimizer and the clipping read (`build`), the built-in
pretrained and tiny models, and reading weights back from checkpoints (`weights`)."""
