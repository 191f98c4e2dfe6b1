"""deltaserve: an LLM inference engine and OpenAI-compatible server for hybrid linear-attention models."""

from deltaserve.errors import (
    DeltaServeError,
    EngineDeadError,
    InvalidPromptError,
    InvalidSamplingParamsError,
    NoTokenAllowedError,
    PromptTooLongError,
    RequestNotFoundError,
    ShapeMismatchError,
    StepFailedError,
    UnsupportedArchitectureError,
    WeightLoadError,
)
from deltaserve.outputs import CompletionOutput, Logprob, RequestOutput
from deltaserve.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, StructuredOutputsParams


def __getattr__(name):
    # LLM pulls in torch and the models; importing it lazily keeps `import deltaserve` light.
    if name == "LLM":
        from deltaserve.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = [
    "LLM", "SamplingParams", "BeamSearchParams", "StructuredOutputsParams", "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob",
    "DeltaServeError", "EngineDeadError", "InvalidPromptError", "InvalidSamplingParamsError", "NoTokenAllowedError",
    "PromptTooLongError", "RequestNotFoundError", "ShapeMismatchError", "StepFailedError",
    "UnsupportedArchitectureError", "WeightLoadError",
]
