"""LLM: the synchronous front for offline use — generate over a list of prompts, or chat."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import jinja2
from tqdm import tqdm

from deltaserve.chat_content import ContentPartError, template_content
from deltaserve.chat_content_format import CONTENT_FORMATS, messages_for_template, resolve_content_format
from deltaserve.engine.beam_search import BeamSearch
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.errors import (DeltaServeError, InvalidPromptError, InvalidSamplingParamsError, RequestNotFoundError,
                               StepFailedError, WeightLoadError)
from deltaserve.outputs import BeamSearchOutput, BeamSearchSequence, RequestOutput
from deltaserve.sampling_params import BeamSearchParams, SamplingParams
from deltaserve.tokenizer import RENDERING_ARGUMENTS, read_chat_template
from deltaserve.vllm_engine_args import engine_args_from_vllm

Prompt = str | list[int]  # generate also takes vLLM's prompt dicts, {"prompt": text} and {"prompt_token_ids": ids}


class LLM:
    def __init__(self, model: str | None = None, *, dtype: str = "auto", device: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 block_size: int = 16, num_kv_blocks: int | None = None, seed: int = 0, **engine_kwargs):
        """engine_kwargs: EngineConfig's other fields, and vLLM's arguments of the same kind
        (vllm_engine_args.py: taken, renamed, or refused by name)."""
        translated = engine_args_from_vllm(model, engine_kwargs)
        if num_kv_blocks is not None and "num_kv_blocks" in translated:
            raise DeltaServeError("num_gpu_blocks_override and num_kv_blocks name the same setting: give one of them")
        settings = dict(dtype=dtype, device=device, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                        num_kv_blocks=num_kv_blocks, seed=seed)
        self.engine = LLMEngine.from_args(model, **(settings | translated))
        self._ids = itertools.count()
        self._enqueued: list[str] = []  # enqueue's requests, for wait_for_completion
        self._kept: dict[str, RequestOutput] = {}  # those of them that finished while another call waited

    def get_tokenizer(self):
        """The model's tokenizer: deltaserve's, which also answers as the Hugging Face tokenizer under it does
        (apply_chat_template(..., tokenize=...), eos_token_id, batch_decode, calling it), as vLLM's does."""
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate and chat use without SamplingParams: the checkpoint's generation_config.json values
        (unless generation_config="vllm") over SamplingParams' own."""
        return self.engine.default_sampling_params()

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 use_tqdm: bool | Callable[..., tqdm] = True, lora_request=None, priority: list[int] | None = None,
                 tokenization_kwargs: dict | None = None, mm_processor_kwargs: dict | None = None
                 ) -> list[RequestOutput]:
        """The outputs of the prompts, in their order. use_tqdm: a progress bar over the finished prompts on
        stderr, as vLLM's (False: none; a tqdm class: the bar it makes). priority: one integer a prompt, as vLLM's,
        under scheduling_policy="priority" (a lower value is served first); under fcfs only zeros. vLLM's other
        options are taken where they ask nothing (None) and refused by name otherwise (_refuse_run_options)."""
        _refuse_run_options(lora_request=lora_request, tokenization_kwargs=tokenization_kwargs,
                            mm_processor_kwargs=mm_processor_kwargs)
        prompts = _as_prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self.get_default_sampling_params)
        priorities = _priority_per_prompt(priority, len(prompts))
        return self._run([(p, sp, None, salt) for (p, salt), sp in zip(prompts, params)], use_tqdm=use_tqdm,
                         priorities=priorities)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool | Callable[..., tqdm] = True, lora_request=None, *, chat_template: str | None = None,
             chat_template_content_format: str = "auto", add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None, tokenization_kwargs: dict | None = None,
             mm_processor_kwargs: dict | None = None) -> list[RequestOutput]:
        """Renders each conversation with the chat template and generates its reply, as vLLM's LLM.chat:
        chat_template (a file or the template itself) in place of the engine's for this call,
        continue_final_message to go on writing the last message (add_generation_prompt then False), and
        chat_template_kwargs for the template's own variables (enable_thinking, ...)."""
        _refuse_run_options(lora_request=lora_request, tokenization_kwargs=tokenization_kwargs,
                            mm_processor_kwargs=mm_processor_kwargs)
        jobs, texts = self._chat_jobs(messages, sampling_params, chat_template, chat_template_content_format,
                                      add_generation_prompt, continue_final_message, tools, chat_template_kwargs)
        return self._run(jobs, texts=texts, use_tqdm=use_tqdm)

    def enqueue(self, prompts: Prompt | list[Prompt],
                sampling_params: SamplingParams | list[SamplingParams] | None = None, lora_request=None,
                priority: list[int] | None = None, use_tqdm: bool | Callable[..., tqdm] = True,
                tokenization_kwargs: dict | None = None, mm_processor_kwargs: dict | None = None) -> list[str]:
        """vLLM's: queues the prompts as generate would and returns their request ids at once; wait_for_completion
        runs them. use_tqdm is taken (the queueing needs no bar)."""
        _refuse_run_options(lora_request=lora_request, tokenization_kwargs=tokenization_kwargs,
                            mm_processor_kwargs=mm_processor_kwargs)
        prompts = _as_prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self.get_default_sampling_params)
        ids = self._add([(p, sp, None, salt) for (p, salt), sp in zip(prompts, params)],
                        priorities=_priority_per_prompt(priority, len(prompts)))
        self._enqueued += ids
        return ids

    def enqueue_chat(self, messages: list[dict] | list[list[dict]],
                     sampling_params: SamplingParams | list[SamplingParams] | None = None,
                     use_tqdm: bool | Callable[..., tqdm] = True, lora_request=None,
                     priority: list[int] | None = None, chat_template: str | None = None,
                     chat_template_content_format: str = "auto", add_generation_prompt: bool = True,
                     continue_final_message: bool = False, tools: list[dict] | None = None,
                     chat_template_kwargs: dict | None = None, tokenization_kwargs: dict | None = None,
                     mm_processor_kwargs: dict | None = None) -> list[str]:
        """vLLM's: renders and queues the conversations as chat would, and returns their request ids at once."""
        _refuse_run_options(lora_request=lora_request, tokenization_kwargs=tokenization_kwargs,
                            mm_processor_kwargs=mm_processor_kwargs)
        jobs, texts = self._chat_jobs(messages, sampling_params, chat_template, chat_template_content_format,
                                      add_generation_prompt, continue_final_message, tools, chat_template_kwargs)
        ids = self._add(jobs, texts, _priority_per_prompt(priority, len(jobs)))
        self._enqueued += ids
        return ids

    def wait_for_completion(self, output_type=None, *, use_tqdm: bool | Callable[..., tqdm] = True
                            ) -> list[RequestOutput]:
        """vLLM's: runs what enqueue and enqueue_chat queued until each has finished; their outputs in the order
        they were queued. output_type is taken (deltaserve's outputs are RequestOutputs)."""
        ids, self._enqueued = self._enqueued, []
        return self._wait(ids, use_tqdm)

    def _chat_jobs(self, messages, sampling_params, chat_template, chat_template_content_format,
                   add_generation_prompt, continue_final_message, tools, chat_template_kwargs):
        """Each conversation rendered with the chat template: (ids, params, message offsets, salt) and its text."""
        if chat_template_content_format not in CONTENT_FORMATS:
            raise InvalidPromptError(f"chat_template_content_format={chat_template_content_format!r}: give one of "
                                     f"{', '.join(CONTENT_FORMATS)}")
        conversations = _as_conversation_list(messages)
        params = _params_per_prompt(sampling_params, len(conversations), self.get_default_sampling_params)
        options = _template_options(chat_template, continue_final_message, add_generation_prompt,
                                    chat_template_kwargs)
        tok = self.engine.tokenizer
        given = chat_template_content_format if chat_template_content_format != "auto" else tok.chat_content_format
        content_format = resolve_content_format(given, options.get("chat_template") or tok.hf.chat_template)
        jobs, texts = [], []
        for conversation, sp in zip(conversations, params):
            conversation = messages_for_template(_template_messages(conversation), content_format)
            text = tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=add_generation_prompt,
                                           **options)
            ids = tok.encode(text, add_special_tokens=False)
            offsets = tok.message_offsets(conversation, tools=tools, full=ids, **options)
            jobs.append((ids, sp, offsets, None))
            texts.append(text)
        return jobs, texts

    def beam_search(self, prompts: Prompt | list[Prompt], params: BeamSearchParams, lora_request=None,
                    use_tqdm: bool = False, concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's: each prompt's best params.beam_width sequences (engine/beam_search.py), in the prompts' order.
        Every step runs one request a live beam of every prompt searched at once; concurrency_limit searches
        that many prompts at a time. use_tqdm: a bar over the prompts as their searches end."""
        _refuse_run_options(lora_request=lora_request)
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool)
                                              or not isinstance(concurrency_limit, int) or concurrency_limit < 1):
            raise InvalidSamplingParamsError(f"concurrency_limit={concurrency_limit!r}: must be at least 1")
        searches = [(self.engine.beam_search(prompt, params), salt) for prompt, salt in _as_prompt_list(prompts)]
        limit = concurrency_limit or len(searches)
        bar = tqdm(total=len(searches), desc="Beam search", dynamic_ncols=True) if use_tqdm else None
        try:
            for start in range(0, len(searches), limit):
                self._search(searches[start:start + limit], bar)
        finally:
            if bar is not None:
                bar.close()
        return [_beam_search_output(search, self.engine.tokenizer) for search, _ in searches]

    def _search(self, searches: list[tuple[BeamSearch, str | None]], bar) -> None:
        """Runs the searches' steps together until each has finished."""
        steps = {id(search): search.step_params() for search, _ in searches}
        active = list(searches)
        while active:
            jobs = [(prompt, steps[id(search)], None, salt) for search, salt in active
                    for prompt in search.next_prompts()]
            outputs = iter(self._run(jobs))
            for search, _ in active:
                search.advance([next(outputs).outputs[0].logprobs[0] for _ in search.live])
            still = [(search, salt) for search, salt in active if not search.finished]
            if bar is not None:
                bar.update(len(active) - len(still))
            active = still

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached KV block and state snapshot (the next requests run cold)."""
        self.engine.reset_prefix_cache()

    def start_profile(self, profile_prefix: str | None = None) -> None:
        """vLLM's: the profiler of profiler_config traces the engine's steps from here; profile_prefix names its
        trace's file."""
        self.engine.start_profile(profile_prefix)

    def stop_profile(self) -> None:
        """vLLM's: the profiler stops; a torch profiler writes its trace to profiler_config's torch_profiler_dir."""
        self.engine.stop_profile()

    def _run(self, jobs, texts: list[str] | None = None, use_tqdm: bool | Callable = False,
             priorities: list[int] | None = None) -> list[RequestOutput]:
        return self._wait(self._add(jobs, texts, priorities), use_tqdm)

    def _add(self, jobs, texts: list[str] | None = None, priorities: list[int] | None = None) -> list[str]:
        """Queues the jobs, all or none; their request ids."""
        ids = [str(next(self._ids)) for _ in jobs]
        added = []
        try:
            for i, (request_id, (prompt, sp, offsets, salt)) in enumerate(zip(ids, jobs)):
                self.engine.add_request(request_id, prompt, sp, capture_points=offsets,
                                        prompt_text=texts[i] if texts else None, cache_salt=salt,
                                        priority=priorities[i] if priorities else 0)
                added.append(request_id)
        except Exception:
            for request_id in added:  # all or nothing: a bad prompt leaves nothing queued
                self.engine.abort(request_id)
            raise
        return ids

    def _wait(self, ids: list[str], use_tqdm: bool | Callable = False) -> list[RequestOutput]:
        """Steps the engine until the requests `ids` have finished; their outputs in that order. Enqueued requests
        that finish meanwhile are kept for wait_for_completion."""
        finished = {i: self._kept.pop(i) for i in ids if i in self._kept}
        progress = _ProgressBar(use_tqdm, len(ids))
        waiting = set(ids)
        try:
            while len(finished) < len(ids):
                for output in self.engine.step(final_only=True):
                    if not output.finished:
                        continue
                    if output.request_id in waiting:
                        finished[output.request_id] = output
                        progress.finished(output)
                    else:  # enqueued, and not waited for yet
                        self._kept[output.request_id] = output
            # a step launched before a stop was read back still runs, for rows that have finished: the engine is
            # left idle, as a caller of vLLM's LLM finds it (has_unfinished_requests False)
            while self.engine.has_unfinished_requests() and not self.engine.scheduler.has_unfinished():
                self.engine.step()
        except BaseException:  # a failure out of the step, or Ctrl-C: the engine keeps nothing of this call
            for request_id in ids:
                if request_id not in finished:
                    self._abort_quietly(request_id)
            raise
        finally:
            progress.close()
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


class _ProgressBar:
    """vLLM's bar over a call's prompts as they finish, with the input and output tokens per second so far."""

    def __init__(self, use_tqdm: bool | Callable, total: int):
        make = use_tqdm if callable(use_tqdm) else tqdm
        self.bar = make(total=total, desc="Processed prompts", dynamic_ncols=True) if use_tqdm else None
        self.start, self.input_tokens, self.output_tokens = time.perf_counter(), 0, 0

    def finished(self, output: RequestOutput) -> None:
        if self.bar is None:
            return
        self.input_tokens += len(output.prompt_token_ids)
        self.output_tokens += sum(len(o.token_ids) for o in output.outputs)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"input: {self.input_tokens / elapsed:.1f} toks/s, "
                                 f"output: {self.output_tokens / elapsed:.1f} toks/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _beam_search_output(search: BeamSearch, tokenizer) -> BeamSearchOutput:
    """vLLM's output of a search: each best beam's whole sequence, prompt included, and its text with the special
    tokens, as vLLM's tokenizer decodes it."""
    sequences = []
    for beam in search.best():
        tokens = search.prompt + beam.tokens
        sequences.append(BeamSearchSequence(tokens=tokens, logprobs=beam.logprobs, cum_logprob=beam.cum_logprob,
                                            text=tokenizer.decode(tokens, skip_special_tokens=False),
                                            finish_reason=beam.finish_reason, stop_reason=beam.stop_reason))
    return BeamSearchOutput(sequences)


# vLLM's options of a generate or chat call that deltaserve has nothing to do with: why, for any value but None
_RUN_OPTIONS = {"lora_request": "deltaserve serves no LoRA adapters",
                "tokenization_kwargs": "deltaserve tokenizes a prompt whole, as the tokenizer's defaults do",
                "mm_processor_kwargs": "deltaserve serves text alone"}


def _refuse_run_options(**given) -> None:
    for name, value in given.items():
        if value is not None:
            raise InvalidPromptError(f"{name}={value!r}: {_RUN_OPTIONS[name]} (leave it out)")


# set by chat's own arguments, so not taken from chat_template_kwargs
# apply_chat_template's own arguments: chat sets them (from its arguments, where it takes them), so a template
# variable of the same name would collide with them
_CHAT_ARGUMENTS = ("chat_template", "add_generation_prompt", "continue_final_message", "tools", *RENDERING_ARGUMENTS)


def _template_options(chat_template: str | None, continue_final_message: bool, add_generation_prompt: bool,
                      chat_template_kwargs: dict | None) -> dict:
    """The keyword arguments of a chat call's template renders, less tools and add_generation_prompt."""
    if chat_template_kwargs is not None and (not isinstance(chat_template_kwargs, dict)
                                             or not all(isinstance(k, str) for k in chat_template_kwargs)):
        raise InvalidPromptError("chat_template_kwargs must be a dict of the template's variables by name, got "
                                 f"{chat_template_kwargs!r:.80}")
    options = dict(chat_template_kwargs or {})
    named = sorted(set(options) & set(_CHAT_ARGUMENTS))
    if named:
        raise InvalidPromptError(f"chat_template_kwargs may not carry {', '.join(named)}: chat sets them itself "
                                 "(as its own arguments, where it takes them)")
    if continue_final_message:
        if add_generation_prompt:
            raise InvalidPromptError("continue_final_message goes on writing the last message, so it needs "
                                     "add_generation_prompt=False")
        options["continue_final_message"] = True
    if chat_template is not None:
        try:
            options["chat_template"] = read_chat_template(chat_template)
            jinja2.Environment().parse(options["chat_template"])
        except (WeightLoadError, jinja2.TemplateSyntaxError) as exc:
            raise InvalidPromptError(f"chat_template: {exc}") from exc
    return options


def _as_prompt_list(prompts) -> list[tuple[Prompt, str | None]]:
    """Each prompt's text or ids, and its cache salt (None: none)."""
    if (isinstance(prompts, (str, dict))
            or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))):
        return [_plain_prompt(prompts)]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InvalidPromptError("prompts must be a string, a list of token ids, a prompt dict, or a non-empty "
                                 "list of those")
    return [_plain_prompt(p) for p in prompts]


def _plain_prompt(prompt) -> tuple[Prompt, str | None]:
    """vLLM's prompt dicts, {"prompt": text} and {"prompt_token_ids": ids} with an optional "cache_salt", as
    the text or ids they hold and the salt."""
    if not isinstance(prompt, dict):
        return prompt, None
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"})
    if unknown:
        raise InvalidPromptError(f"a prompt dict's {', '.join(map(repr, unknown))} is not supported: give "
                                 "'prompt' (text) or 'prompt_token_ids', and 'cache_salt' if you like")
    given = [key for key in ("prompt", "prompt_token_ids") if key in prompt]
    if len(given) != 1:
        raise InvalidPromptError("a prompt dict holds either 'prompt' (text) or 'prompt_token_ids', one of them")
    value = prompt[given[0]]
    if given[0] == "prompt" and not isinstance(value, str):
        raise InvalidPromptError(f"a prompt dict's 'prompt' is text, got {type(value).__name__} (token ids go "
                                 "under 'prompt_token_ids')")
    if given[0] == "prompt_token_ids" and not isinstance(value, (list, tuple)):
        raise InvalidPromptError(f"a prompt dict's 'prompt_token_ids' is a list of token ids, got "
                                 f"{type(value).__name__} (text goes under 'prompt')")
    return value, prompt.get("cache_salt")


def _as_conversation_list(messages) -> list[list[dict]]:
    """One conversation (a list of message dicts) or a non-empty list of them."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, dict) for m in messages):
        return [list(messages)]
    if (isinstance(messages, (list, tuple)) and messages
            and all(isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c) for c in messages)):
        return [list(c) for c in messages]
    raise InvalidPromptError("messages must be a conversation (a non-empty list of message dicts) or a non-empty "
                             f"list of conversations, got {type(messages).__name__}")


def _template_messages(conversation: list[dict]) -> list[dict]:
    """OpenAI's messages as vLLM's LLM.chat takes them: content a string, None (an assistant turn of tool calls
    only) or a list of text parts (text parts, and a refusal part's refusal), given to the template in the form it
    reads (chat_content_format)."""
    return [message if isinstance(message.get("content", ""), str)
            else {**message, "content": _parts(message.get("content"), i)}
            for i, message in enumerate(conversation)]


def _parts(content, index: int) -> list[dict] | None:
    if content is not None and not isinstance(content, (list, tuple)):
        raise InvalidPromptError(f"messages[{index}]'s content must be a string or a list of text parts, got "
                                 f"{type(content).__name__}")
    try:
        return template_content(content, ("text", "refusal"))
    except ContentPartError as exc:
        raise InvalidPromptError(f"messages[{index}]'s {exc}") from None


def _priority_per_prompt(priority, count: int) -> list[int] | None:
    """generate's priority: None, or a list of one integer a prompt (as vLLM's; the engine checks each against
    its scheduling policy)."""
    if priority is None:
        return None
    if not isinstance(priority, (list, tuple)):
        raise InvalidPromptError(f"priority={priority!r}: give a list of integers, one a prompt")
    if len(priority) != count:
        raise InvalidPromptError(f"priority: {len(priority)} values for {count} prompts (give one a prompt)")
    return list(priority)


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


# vLLM's LLM methods for what deltaserve does not do: each refuses by name, where an AttributeError would leave a
# script written for vLLM guessing.
NOT_OFFERED = {
    "encode": "deltaserve runs generative models only: no pooling (encode, embed, classify, score, reward)",
    "embed": "deltaserve runs generative models only: no embeddings",
    "classify": "deltaserve runs generative models only: no classification",
    "score": "deltaserve runs generative models only: no scoring models",
    "reward": "deltaserve runs generative models only: no reward models",
    "sleep": "sleep mode (offloading weights and freeing the KV cache) is not supported",
    "wake_up": "sleep mode (offloading weights and freeing the KV cache) is not supported",
}


def _refusing(name: str, why: str):
    def method(self, *args, **kwargs):
        raise DeltaServeError(f"LLM.{name}: {why}")

    method.__name__ = name
    method.__doc__ = f"Refused: {why}."
    return method


for _name, _why in NOT_OFFERED.items():
    setattr(LLM, _name, _refusing(_name, _why))
