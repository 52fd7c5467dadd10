"""vLLM V1 -> fsdist: sample with fsdist in place of ``compute_logits`` + ``Sampler``.

Written against vLLM 0.33.0. vLLM's GPU model runner ends a decode step with::

    logits = model.compute_logits(sample_hidden_states)                  # [B, V] in memory
    apply_grammar_bitmask(scheduler_output, grammar_output, input_batch, logits)
    sampler_output = sampler(logits, input_batch.sampling_metadata)

With this module the three become one fused call that never writes the logits::

    import fsdist
    from fsdist.integrations import vllm as fsv

    meta = input_batch.sampling_metadata
    kw = fsv.sampling_kwargs(
        meta, seeds=seeds, positions=positions, vocab_size=V,
        grammar_bitmask=fsv.grammar_bitmask(grammar_output, input_batch.req_ids, V, device),
        logprobs_mode=model_config.logprobs_mode)
    out = fsdist.sample(sample_hidden_states, lm_head.weight, vocab_size=V, **kw)
    # or, vocabulary-parallel: out = head(sample_hidden_states, **kw)
    sampler_output = fsv.to_sampler_output(out, meta.max_num_logprobs)

Shapes: ``sample_hidden_states`` [B, D] (one row per request, no speculative tokens),
``lm_head.weight`` [V_padded, D]; ``seeds`` and ``positions`` [B] int64 (device tensors, or
sequences of ints, which are copied to the device without a sync); V = the model's
vocabulary (``model_config.get_vocab_size()``, the width of vLLM's logits).

What maps to what (``SamplingMetadata`` field -> ``fsdist.sample`` argument):

=====================================  ==================================================
``temperature`` (None: all greedy;       ``temperature``: 0.0, or the [B] tensor as is (0 =
0 in greedy rows)                        greedy; both use vLLM's 1e-5 epsilon)
``top_k`` (None, or [B] int32 with       ``top_k`` as is (``>= vocab_size`` is off in fsdist too)
V for "off")
``top_p`` (None or [B])                  ``top_p`` as is
``MinPLogitsProcessor.min_p`` [B, 1]     ``min_p`` [B] (only while its ``min_p_count`` > 0)
``LogitBiasLogitsProcessor.biases``      ``logit_bias=SparseLogits`` [B, K], built on the host
                                         from vLLM's dict (K = the longest row)
``no_penalties``, ``repetition/``        ``penalties=Penalties(repetition, frequency,
``frequency/presence_penalties`` [B],    presence, output_ids, prompt_ids)``; prompt padding
``prompt_token_ids`` (padded with V),    V -> -1; ``output_token_ids`` (Python lists) -> one
``output_token_ids`` (lists)             -1-padded [B, L] tensor built on the host
``allowed_token_ids_mask`` [B, V] bool   ``token_bitmask`` (packed on the device; ANDed with
(True = banned); the grammar bitmask     the grammar bitmask and the bans below)
``bad_words_token_ids``,                 banned ids cleared in ``token_bitmask`` (host
``MinTokensLogitsProcessor``             logic, as in vLLM, over the output lists)
``max_num_logprobs``                     ``return_logprobs=True``, ``top_logprobs=N``
logprobs_mode ``raw_logprobs`` /         ``logprobs_mode`` ``"raw"`` / ``"processed"``
``processed_logprobs``
``generators`` (per-request torch RNG)   superseded by ``seeds`` / ``positions`` (below)
=====================================  ==================================================

Seeds and positions. fsdist's noise for (row, vocabulary id) is a pure function of
(seed, offset, id): pass each request's seed (``SamplingParams.seed``, or for an unseeded
request one random 63-bit integer drawn once when it is admitted) and the position of the
token being sampled (the request's token count so far, prompt + output, e.g.
``input_batch.num_tokens_no_spec[:B]``). A request's token then depends only on its own
(seed, position) and logits, not on its batch slot, the other requests or the
tensor-parallel degree. vLLM's generators do not have that property (an unseeded request
shares the batch's generator; a seeded one's state advances with every step it is in), so
the two agree in distribution, never token for token.

Host work and syncs. Nothing here reads a device tensor on the host. Built on the host
each step and copied to the device asynchronously (pinned memory on CUDA): the
``output_token_ids`` tensor (vLLM builds the same one in ``apply_all_penalties``), the
logit-bias table, the banned ids of bad words / min-tokens and sequence seeds or
positions. The allowed-token mask is packed into bitmask words on the device (one pass
over [B, V] bools, where vLLM does a masked fill of the same size).

Not supported (``UnsupportedFeatureError``, naming the field): speculative decoding
(``spec_token_ids``; vLLM's RejectionSampler), ``logprob_token_ids``, full-vocabulary
logprobs (``max_num_logprobs == -1``) or more than 20, the ``raw_logits`` /
``processed_logits`` logprobs modes, ``raw_logprobs`` together with any logit processor
(fsdist's raw logprobs need the unprocessed logits beside the processed ones; use
``processed_logprobs``), a thinking-token budget, and custom logits processors (their
``apply`` needs the logits tensor).

vLLM is imported only by :func:`to_sampler_output`; :func:`sampling_kwargs` reads the
metadata by attribute (any object with ``SamplingMetadata``'s fields works) and
recognises vLLM's built-in logits processors by class name.
"""
import itertools
from typing import Optional, Sequence, Union

import torch

from ..params import MAX_TOP_LOGPROBS
from ..reference.processors import bitmask_from_allowed
from ..types import Penalties, SampleOutput, SparseLogits

IntRows = Union[torch.Tensor, Sequence[int]]

LOGPROBS_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
_KNOWN_PROCESSORS = ("MinPLogitsProcessor", "LogitBiasLogitsProcessor", "MinTokensLogitsProcessor")


class UnsupportedFeatureError(NotImplementedError):
    """A vLLM sampling feature that fsdist does not implement (the message names the field)."""


def sampling_kwargs(metadata, *, seeds: IntRows, positions: IntRows, vocab_size: int,
                    grammar_bitmask: Optional[torch.Tensor] = None, logprobs_mode: str = "raw_logprobs",
                    device: Optional[Union[str, torch.device]] = None) -> dict:
    """Keyword arguments for ``fsdist.sample`` / ``ShardedFlashLMHead.forward`` from vLLM's
    ``SamplingMetadata`` (see the module docstring for the mapping).

    metadata: vLLM V1 ``SamplingMetadata`` of the B requests being sampled (one row each).
    seeds, positions: [B] int64 (tensor on the sampling device, or a sequence of ints).
    vocab_size: the model's vocabulary, V (the width of vLLM's logits).
    grammar_bitmask: int32 [B, >= ceil(V / 32)] in batch order (see :func:`grammar_bitmask`),
        -1 words in rows without a grammar; None when no request is structured.
    logprobs_mode: vLLM's ``model_config.logprobs_mode``.
    device: where the tensors go; default: that of ``seeds``, else of the metadata's tensors.

    Returns a dict with temperature, seed, offset, top_k, top_p, min_p, token_bitmask,
    logit_bias, penalties, return_logprobs, top_logprobs and logprobs_mode (``vocab_size``
    is not included: pass it to ``fsdist.sample``; a head knows it already).

    Example (two requests, the second greedy; vLLM builds ``meta`` in its input batch)::

        kw = sampling_kwargs(meta, seeds=[1234, 99], positions=[17, 5], vocab_size=32000)
        out = fsdist.sample(hidden, weight, vocab_size=32000, **kw)   # hidden [2, D]
        out.tokens                                                    # int64 [2]
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size}")
    _refuse_unsupported(metadata)
    device = torch.device(device) if device is not None else _device_of(metadata, seeds, positions)
    seed = _int_rows(seeds, "seeds", device)
    offset = _int_rows(positions, "positions", device)
    batch = seed.shape[0]
    if offset.shape[0] != batch:
        raise ValueError(f"positions has {offset.shape[0]} rows but seeds has {batch}: one of each per request")

    def rows(x, name):  # a [B] metadata tensor, on `device`
        if x.dim() != 1 or x.shape[0] != batch:
            raise ValueError(f"metadata.{name} has shape {tuple(x.shape)}, expected [{batch}] (one per request)")
        return x.to(device, non_blocking=True)

    kw = dict(seed=seed, offset=offset)
    kw["temperature"] = 0.0 if metadata.temperature is None else rows(metadata.temperature, "temperature")
    kw["top_k"] = 0 if metadata.top_k is None else rows(metadata.top_k, "top_k")
    kw["top_p"] = 1.0 if metadata.top_p is None else rows(metadata.top_p, "top_p")
    procs = _builtin_processors(metadata)
    min_p = procs.get("MinPLogitsProcessor")
    kw["min_p"] = 0.0 if min_p is None or not min_p.min_p_count else rows(min_p.min_p.reshape(-1), "min_p")
    kw["logit_bias"] = _logit_bias(procs.get("LogitBiasLogitsProcessor"), batch, device)
    kw["penalties"] = _penalties(metadata, batch, vocab_size, device, rows)
    kw["token_bitmask"] = _token_bitmask(metadata, procs.get("MinTokensLogitsProcessor"), grammar_bitmask, batch,
                                         vocab_size, device)

    n = metadata.max_num_logprobs
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise UnsupportedFeatureError(
            f"metadata.max_num_logprobs={n}: fsdist returns at most {MAX_TOP_LOGPROBS} top logprobs per row"
            + (" (-1, the full vocabulary, would need the logits fsdist never writes)" if n == -1 else ""))
    if logprobs_mode not in LOGPROBS_MODES:
        raise UnsupportedFeatureError(f"logprobs_mode={logprobs_mode!r}: fsdist supports "
                                      f"{', '.join(map(repr, LOGPROBS_MODES))}")
    mode = LOGPROBS_MODES[logprobs_mode]
    processed = any(kw[k] is not None for k in ("logit_bias", "penalties", "token_bitmask"))
    if n is not None and mode == "raw" and processed:
        raise UnsupportedFeatureError(
            "logprobs_mode='raw_logprobs' with logit bias, penalties, allowed_token_ids, bad words, min-tokens or "
            "a grammar in the batch: fsdist's raw logprobs need the unprocessed logits beside the processed ones; "
            "serve with logprobs_mode='processed_logprobs'")
    kw.update(return_logprobs=n is not None, top_logprobs=n or 0, logprobs_mode=mode)
    return kw


def grammar_bitmask(grammar_output, req_ids: Sequence[str], vocab_size: int,
                    device: Union[str, torch.device]) -> Optional[torch.Tensor]:
    """vLLM's structured-output bitmask in batch order: int32 [B, ceil(V / 32)], -1 (all
    allowed) in rows without a grammar; None when ``grammar_output`` is None.

    ``grammar_output``: the scheduler's ``GrammarOutput`` (``structured_output_request_ids``
    and a numpy ``grammar_bitmask`` in that order, ``1 + num_spec_tokens`` rows per request;
    the first row of each is the one for the token sampled here). ``req_ids``: the input
    batch's request ids, row order. Built on the host, copied asynchronously.
    """
    if grammar_output is None:
        return None
    ids = list(grammar_output.structured_output_request_ids)
    words = (vocab_size + 31) // 32
    out = torch.full((len(req_ids), words), -1, dtype=torch.int32)
    if ids:
        mask = torch.from_numpy(grammar_output.grammar_bitmask)
        stride = mask.shape[0] // len(ids)
        row_of = {r: i for i, r in enumerate(req_ids)}
        for i, req in enumerate(ids):
            b = row_of.get(req)
            if b is not None:
                w = min(words, mask.shape[1])
                out[b, :w] = mask[i * stride, :w]
                out[b, w:] = 0  # ids past the grammar's vocabulary: not allowed
    return _to_device(out, device)


def to_sampler_output(out: SampleOutput, max_num_logprobs: Optional[int]):
    """fsdist's ``SampleOutput`` as vLLM's ``SamplerOutput``.

    ``sampled_token_ids`` int32 [B, 1] (-1 in a row fsdist could not sample: NaN logits or
    a bad parameter value, which vLLM reads as "no token"); with ``max_num_logprobs = N``
    also ``LogprobsTensors``: ids int32 [B, N + 1] and logprobs fp32 [B, N + 1] (the sampled
    token first, then the top N, as vLLM lays them out), and ``selected_token_ranks`` [B]:
    exact when the sampled token is among the top N, otherwise N + 1, a lower bound
    (fsdist does not count the ids ranked above a token outside its top-N list).
    """
    if max_num_logprobs is not None:  # (checked before vLLM's import: the mismatch is ours to name)
        if out.logprobs is None:
            raise ValueError("max_num_logprobs is set but the SampleOutput has no logprobs "
                             "(call fsdist with sampling_kwargs' return_logprobs / top_logprobs)")
        have = 0 if out.top_ids is None else out.top_ids.shape[1]
        if have != max_num_logprobs:
            raise ValueError(f"max_num_logprobs is {max_num_logprobs} but the SampleOutput lists {have} top ids "
                             "(call fsdist with sampling_kwargs' top_logprobs = max_num_logprobs)")
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput

    sampled = out.tokens.to(torch.int32).unsqueeze(-1)
    if max_num_logprobs is None:
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)
    lp = out.logprobs.unsqueeze(-1)
    if max_num_logprobs:
        ids = torch.cat([out.tokens.unsqueeze(-1), out.top_ids], dim=1)
        lps = torch.cat([lp, out.top_logprobs], dim=1)
        match = out.top_ids == out.tokens.unsqueeze(-1)
        # The token's value as listed (its separately computed logprob may differ in the last bit).
        listed_lp = torch.where(match, out.top_logprobs, float("inf")).amin(dim=1, keepdim=True)
        ranks = torch.where(match.any(dim=1), (out.top_logprobs >= listed_lp).sum(dim=1), max_num_logprobs + 1)
    else:
        ids, lps = out.tokens.unsqueeze(-1), lp
        ranks = torch.ones_like(out.tokens)
    return SamplerOutput(sampled_token_ids=sampled,
                         logprobs_tensors=LogprobsTensors(ids.to(torch.int32), lps, ranks))


# --------------------------------------------------------------------------- helpers


def _refuse_unsupported(metadata):
    if any(getattr(metadata, "spec_token_ids", None) or ()):
        raise UnsupportedFeatureError("metadata.spec_token_ids: speculative decoding (vLLM's RejectionSampler) "
                                      "is not covered; sample one token per request")
    if getattr(metadata, "logprob_token_ids", None):
        raise UnsupportedFeatureError("metadata.logprob_token_ids: logprobs of chosen ids need the logits "
                                      "fsdist never writes")
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        raise UnsupportedFeatureError("metadata.thinking_budget_state_holder: a thinking-token budget is not "
                                      "supported")


def _builtin_processors(metadata) -> dict:
    procs = {}
    lp = getattr(metadata, "logitsprocs", None)
    found = [] if lp is None else list(lp.argmax_invariant) + list(lp.non_argmax_invariant)
    for p in found:
        name = type(p).__name__
        if name not in _KNOWN_PROCESSORS:
            raise UnsupportedFeatureError(
                f"metadata.logitsprocs holds {name}: custom logits processors need the logits tensor, which "
                f"fsdist never writes (supported: {', '.join(_KNOWN_PROCESSORS)})")
        procs[name] = p
    return procs


def _device_of(metadata, *candidates) -> torch.device:
    for x in (*candidates, metadata.temperature, metadata.top_k, metadata.top_p,
              getattr(metadata, "frequency_penalties", None)):
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _int_rows(x, name: str, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a [B] int64 tensor or a sequence of ints, got {x.dtype} "
                            f"of shape {tuple(x.shape)}")
        return x.to(device=device, dtype=torch.int64, non_blocking=True)
    rows = torch.as_tensor(x, dtype=torch.int64)  # a list, or numpy (input_batch.num_tokens_no_spec[:B])
    if rows.dim() != 1:
        raise TypeError(f"{name} must be [B] (one per request), got shape {tuple(rows.shape)}")
    return _to_device(rows, device)


def _padded(lists, pad: int = -1) -> torch.Tensor:
    """int64 [len(lists), max length] on the host, `pad`-padded (one copy of the flat list)."""
    lengths = torch.tensor([len(x) for x in lists], dtype=torch.int64)
    width = int(lengths.max()) if len(lists) else 0
    out = torch.full((len(lists), width), pad, dtype=torch.int64)
    out[torch.arange(width)[None, :] < lengths[:, None]] = torch.tensor(
        list(itertools.chain.from_iterable(lists)), dtype=torch.int64)
    return out


def _logit_bias(proc, batch: int, device) -> Optional[SparseLogits]:
    """LogitBiasLogitsProcessor.biases ({row: {id: bias}}) as SparseLogits [B, K]."""
    if proc is None or not proc.biases:
        return None
    width = max(len(d) for d in proc.biases.values())
    ids = torch.full((batch, width), -1, dtype=torch.int64)
    values = torch.zeros((batch, width), dtype=torch.float32)
    for row, d in proc.biases.items():
        if row >= batch:
            raise ValueError(f"LogitBiasLogitsProcessor.biases names row {row} of a batch of {batch}")
        ids[row, :len(d)] = torch.tensor(list(d.keys()), dtype=torch.int64)
        values[row, :len(d)] = torch.tensor(list(d.values()), dtype=torch.float32)
    return SparseLogits(_to_device(ids, device), _to_device(values, device))


def _penalties(metadata, batch: int, vocab_size: int, device, rows) -> Optional[Penalties]:
    if metadata.no_penalties:  # the penalty tensors may then hold stale values: vLLM skips them too
        return None
    if metadata.prompt_token_ids is None:
        raise ValueError("metadata.prompt_token_ids is None but no_penalties is False")
    if len(metadata.output_token_ids) != batch:
        raise ValueError(f"metadata.output_token_ids has {len(metadata.output_token_ids)} rows, expected {batch}")
    prompt = metadata.prompt_token_ids.to(device, non_blocking=True)
    prompt = torch.where(prompt >= vocab_size, -1, prompt)  # vLLM pads prompts with V
    # Async scheduling leaves -1 placeholders in the output lists: fsdist's empty slot, as in vLLM.
    output = _to_device(_padded(metadata.output_token_ids), device)
    return Penalties(repetition=rows(metadata.repetition_penalties, "repetition_penalties"),
                     frequency=rows(metadata.frequency_penalties, "frequency_penalties"),
                     presence=rows(metadata.presence_penalties, "presence_penalties"),
                     output_ids=output, prompt_ids=prompt)


def _bad_word_bans(metadata) -> list:
    """(row, id) pairs that vLLM's apply_bad_words sets to -inf this step."""
    bans = []
    outputs = metadata.output_token_ids
    for row, words in (getattr(metadata, "bad_words_token_ids", None) or {}).items():
        past = outputs[row]
        for word in words:
            prefix = word[:-1]
            if len(prefix) <= len(past) and (not prefix or list(past[-len(prefix):]) == list(prefix)):
                bans.append((row, word[-1]))
    return bans


def _clear_bits(bitmask: torch.Tensor, bans, device) -> torch.Tensor:
    """bitmask with the bits of the (row, id) pairs in `bans` cleared (one indexed AND)."""
    words = {}
    for row, tok in bans:
        words[(row, tok // 32)] = words.get((row, tok // 32), 0) | (1 << (tok % 32))
    r = torch.tensor([k[0] for k in words], dtype=torch.int64)
    w = torch.tensor([k[1] for k in words], dtype=torch.int64)
    keep = torch.tensor([v ^ 0xFFFFFFFF for v in words.values()], dtype=torch.int64)
    keep = torch.where(keep >= 2**31, keep - 2**32, keep).to(torch.int32)  # two's complement
    r, w, keep = (_to_device(t, device) for t in (r, w, keep))
    bitmask[r, w] = bitmask[r, w] & keep
    return bitmask


def _token_bitmask(metadata, min_tokens, grammar, batch: int, vocab_size: int, device) -> Optional[torch.Tensor]:
    """The grammar bitmask AND the allowed-token mask, with bad words and min-tokens' stop ids
    cleared (vLLM applies all of them as -inf before the bias and the penalties)."""
    words = (vocab_size + 31) // 32
    bitmask = None
    if grammar is not None:
        if grammar.dtype != torch.int32 or grammar.dim() != 2 or grammar.shape[0] != batch or grammar.shape[1] < words:
            raise ValueError(f"grammar_bitmask must be int32 [{batch}, {words}], got {grammar.dtype} "
                             f"{tuple(grammar.shape)}")
        bitmask = grammar[:, :words].to(device, non_blocking=True)
    banned = metadata.allowed_token_ids_mask
    if banned is not None:
        if banned.dim() != 2 or banned.shape[0] < batch or banned.shape[1] < vocab_size:
            raise ValueError(f"metadata.allowed_token_ids_mask has shape {tuple(banned.shape)}, expected "
                             f"[{batch}, {vocab_size}]")
        allowed = bitmask_from_allowed(~banned[:batch, :vocab_size].to(device, non_blocking=True))
        bitmask = allowed if bitmask is None else bitmask & allowed
    bans = _bad_word_bans(metadata)
    for row, tok in bans:
        if not 0 <= tok < vocab_size:
            raise ValueError(f"metadata.bad_words_token_ids: request {row} bans id {tok}, outside [0, {vocab_size}) "
                             "(vocab_size)")
    stop_bans, restore = [], []
    if min_tokens is not None:
        for row, (_, _, stop_ids, structured) in min_tokens.min_toks.items():
            stop_bans += [(row, t) for t in stop_ids if t < vocab_size]
            if structured:
                restore.append(row)
    if not bans and not stop_bans:
        return bitmask
    bitmask = (torch.full((batch, words), -1, dtype=torch.int32, device=device) if bitmask is None
               else bitmask.clone())
    if bans:
        bitmask = _clear_bits(bitmask, bans, device)
    if stop_bans:
        before = bitmask.clone() if restore else None
        bitmask = _clear_bits(bitmask, stop_bans, device)
        if restore:
            # vLLM puts a structured request's stop ids back when masking them left no id at all.
            tail = vocab_size - 32 * (words - 1)
            valid = torch.full((words,), -1, dtype=torch.int64)
            valid[-1] = (1 << tail) - 1
            valid = torch.where(valid >= 2**31, valid - 2**32, valid).to(torch.int32)
            empty = ((bitmask & _to_device(valid, device)) == 0).all(dim=1)
            rows = torch.zeros(batch, dtype=torch.bool)
            rows[restore] = True
            bitmask = torch.where((empty & _to_device(rows, device))[:, None], before, bitmask)
    return bitmask


__all__ = ["LOGPROBS_MODES", "UnsupportedFeatureError", "grammar_bitmask", "sampling_kwargs", "to_sampler_output"]
