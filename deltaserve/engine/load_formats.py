"""vLLM's load formats that deltaserve takes (kept apart, so that the command line reads them before torch loads):
"auto" reads a checkpoint as it is, safetensors or GGUF; "safetensors" and "gguf" name the checkpoint's own format,
which must be it (model_setup.check_checkpoint_format); "dummy" gives random weights in its shapes (benchmarks)."""

LOAD_FORMATS = ("auto", "dummy", "safetensors", "gguf")
