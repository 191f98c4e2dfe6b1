"""LLM: the synchronous front for offline use — generate over a list of prompts, or chat."""

from __future__ import annotations

import itertools

from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.errors import InvalidPromptError, InvalidSamplingParamsError, RequestNotFoundError, StepFailedError
from deltaserve.outputs import RequestOutput
from deltaserve.sampling_params import SamplingParams

Prompt = str | list[int]  # generate also takes vLLM's prompt dicts, {"prompt": text} and {"prompt_token_ids": ids}


class LLM:
    def __init__(self, model: str | None = None, *, dtype: str = "auto", device: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 block_size: int = 16, num_kv_blocks: int | None = None, seed: int = 0, **engine_kwargs):
        self.engine = LLMEngine.from_args(
            model, dtype=dtype, device=device, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, block_size=block_size, num_kv_blocks=num_kv_blocks,
            seed=seed, **engine_kwargs)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate and chat use without SamplingParams: the checkpoint's generation_config.json values
        (unless generation_config="vllm") over SamplingParams' own."""
        return self.engine.default_sampling_params()

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self.get_default_sampling_params)
        return self._run([(p, sp, None) for p, sp in zip(prompts, params)])

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, *, tools: list[dict] | None = None,
             add_generation_prompt: bool = True, **template_kwargs) -> list[RequestOutput]:
        """Renders each conversation with the checkpoint's chat template and generates its reply."""
        conversations = _as_conversation_list(messages)
        params = _params_per_prompt(sampling_params, len(conversations), self.get_default_sampling_params)
        tok = self.engine.tokenizer
        jobs = []
        for conversation, sp in zip(conversations, params):
            text = tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=add_generation_prompt,
                                           **template_kwargs)
            ids = tok.encode(text, add_special_tokens=False)
            offsets = tok.message_offsets(conversation, tools=tools, add_generation_prompt=add_generation_prompt)
            jobs.append((ids, sp, offsets, text))
        return self._run([(ids, sp, offsets) for ids, sp, offsets, _ in jobs],
                         texts=[text for *_, text in jobs])

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached KV block and state snapshot (the next requests run cold)."""
        self.engine.reset_prefix_cache()

    def _run(self, jobs, texts: list[str] | None = None) -> list[RequestOutput]:
        ids = [str(next(self._ids)) for _ in jobs]
        added = []
        try:
            for i, (request_id, (prompt, sp, offsets)) in enumerate(zip(ids, jobs)):
                self.engine.add_request(request_id, prompt, sp, capture_points=offsets,
                                        prompt_text=texts[i] if texts else None)
                added.append(request_id)
        except Exception:
            for request_id in added:  # all or nothing: a bad prompt leaves nothing queued
                self.engine.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        try:
            while len(finished) < len(ids):
                for output in self.engine.step(final_only=True):
                    if output.finished:
                        finished[output.request_id] = output
        except BaseException:  # a failure out of the step, or Ctrl-C: the engine keeps nothing of this call
            for request_id in ids:
                if request_id not in finished:
                    self._abort_quietly(request_id)
            raise
        aborted = [i for i in ids if any(o.finish_reason == "abort" for o in finished[i].outputs)]
        at_fault = [finished[i].error for i in aborted if finished[i].error is not None]
        if at_fault:  # a request that could not go on (its constraints refused every token)
            raise at_fault[0]
        if aborted:  # otherwise only a failed step aborts a request this call is waiting for
            raise StepFailedError(f"a step failed and the engine aborted {len(aborted)} of the {len(ids)} "
                                  "requests; the log has the traceback") from self.engine.last_failure
        return [finished[i] for i in ids]

    def _abort_quietly(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except RequestNotFoundError:  # finished and forgotten in the step that failed
            pass


def _as_prompt_list(prompts) -> list[Prompt]:
    if (isinstance(prompts, (str, dict))
            or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))):
        return [_plain_prompt(prompts)]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InvalidPromptError("prompts must be a string, a list of token ids, a prompt dict, or a non-empty "
                                 "list of those")
    return [_plain_prompt(p) for p in prompts]


def _plain_prompt(prompt) -> Prompt:
    """vLLM's prompt dicts, {"prompt": text} and {"prompt_token_ids": ids}, as the text or ids they hold."""
    if not isinstance(prompt, dict):
        return prompt
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
    if unknown:
        raise InvalidPromptError(f"a prompt dict's {', '.join(map(repr, unknown))} is not supported: give "
                                 "'prompt' (text) or 'prompt_token_ids'")
    if len(prompt) != 1:
        raise InvalidPromptError("a prompt dict holds either 'prompt' (text) or 'prompt_token_ids', one of them")
    return next(iter(prompt.values()))


def _as_conversation_list(messages) -> list[list[dict]]:
    """One conversation (a list of message dicts) or a non-empty list of them."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, dict) for m in messages):
        return [list(messages)]
    if (isinstance(messages, (list, tuple)) and messages
            and all(isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c) for c in messages)):
        return [list(c) for c in messages]
    raise InvalidPromptError("messages must be a conversation (a non-empty list of message dicts) or a non-empty "
                             f"list of conversations, got {type(messages).__name__}")


def _params_per_prompt(params, count: int, default) -> list[SamplingParams]:
    if params is None:
        return [default() for _ in range(count)]
    if isinstance(params, SamplingParams):
        return [params] * count
    if not isinstance(params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in params):
        raise InvalidSamplingParamsError(f"sampling_params must be a SamplingParams or a list of them, got "
                                         f"{type(params).__name__}")
    if len(params) != count:
        raise InvalidSamplingParamsError(f"{len(params)} sampling params for {count} prompts")
    return list(params)
