"""A request's outputs as the engine streams them, for driving a route's reply writers without a model: the
text cut at random places into cumulative outputs, the last one finished."""

from __future__ import annotations

import random

from deltaserve.outputs import CompletionOutput, RequestOutput


class StreamedOutputs:
    """A request's stream of outputs, as the engine gives them: cumulative, the last finished."""

    def __init__(self, outputs):
        self._outputs = iter(outputs)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self._outputs)
        except StopIteration:
            raise StopAsyncIteration from None

    def close(self):
        pass


def cut_outputs(text: str, request_id: str = "msg_1", finish_reason: str = "stop") -> list[RequestOutput]:
    """`text` in up to four cumulative outputs cut at random places (one token id a character)."""
    cuts = sorted(random.sample(range(1, len(text)), min(3, len(text) - 1))) if len(text) > 1 else []
    return [RequestOutput(request_id, None, [1, 2], [CompletionOutput(0, text[:cut], list(range(cut)),
                                                                      finish_reason if cut == len(text) else None)])
            for cut in [*cuts, len(text)]]
