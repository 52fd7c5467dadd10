"""fsdist.sample: exact sampling fused into the LM-head matmul, on one device.

One call: validate the arguments (``validation``, ``processing`` for the logit
processors), plan the launch (``ops.plan``), run stage 1 into a fresh candidate buffer
(the processors apply inside it, ``ops.processors``), merge (``ops.merge_candidates``); with filters or
top-N logprobs, finish those rows from the kept logits (``ops.select_filtered``) and
resolve the rows they cannot prove exactly (``ops.fallback``).
"""
from typing import Optional, Union

import torch

from . import processing as proc
from . import rows, validation
from .ops.configs import TileConfig, pdl_fallback, pdl_select_beside_merge, pdl_stage2, triton_twin
from .ops.fallback import KeptLogits, run_fallback
from .ops.layout import BufferPair
from .ops.merge_candidates import launch_merge
from .ops.plan import asks_noise_skip, launch_stage1, plan_sample, raw_sums_needed, winner_logits_needed
from .ops.select_filtered import launch_select_filtered, merge_folds
from .types import Penalties, SampleOutput, SparseLogits


def sample(hidden: torch.Tensor, weight: torch.Tensor, *,
           temperature: Union[float, torch.Tensor] = 1.0,
           seed: Union[int, torch.Tensor] = 0,
           offset: Union[int, torch.Tensor] = 0,
           vocab_size: Optional[int] = None,
           top_k: Union[int, torch.Tensor] = 0,
           top_p: Union[float, torch.Tensor] = 1.0,
           min_p: Union[float, torch.Tensor] = 0.0,
           token_bitmask: Optional[torch.Tensor] = None,
           logit_bias: Optional[SparseLogits] = None,
           penalties: Optional[Penalties] = None,
           return_logprobs: bool = False,
           top_logprobs: int = 0,
           logprobs_mode: str = "scaled",
           config: Optional[TileConfig] = None,
           path: Optional[str] = None,
           check: bool = False) -> SampleOutput:
    """Draw one token per row from softmax(hidden @ weight.T / T) without materializing logits.

    hidden: [B, D], or [..., D] (e.g. Megatron's [s, b, h]): one row per leading index, and
        every output comes back with that leading shape (tokens [...]); per-row parameters
        are then scalars, [...] tensors or the flattened [N] (row-major), and the row-indexed
        tables (token_bitmask, logit_bias, penalties' ids) [..., K] or [N, K] (fsdist/rows.py).
        A 0-d tensor of a per-row parameter is every row's value (expanded on the device).
    weight: [V, D] (nn.Linear layout, contiguous); same dtype as hidden, bf16/fp16/fp32.
    temperature: real number or [B] float tensor; below 1e-5 (vLLM's epsilon) the row is
        greedy (argmax); at most 1e30 (finite). A negative, NaN or too large value in a
        tensor makes that row return -1 (a scalar one raises ValueError).
    seed, offset: int or [B] int64 tensors. The noise for (row, vocabulary id v) is a pure
        function of (seed, offset, v), so the same pair gives the same token whatever the
        tile sizes or the row's batch position; use a new offset (e.g. the decode step) for
        a fresh draw.
    vocab_size: true vocabulary size; ids >= vocab_size (padding rows of weight) are never sampled.
    top_k, top_p, min_p: filters, each a scalar or a [B] tensor, applied in vLLM V1's order
        (logits / T -> min-p -> top-k -> top-p on the renormalised survivors; see
        docs/semantics.md). Off: top_k 0, top_p 1.0, min_p 0.0. Greedy rows ignore them.
        Exact: rows the kept logits cannot prove are resolved by an exact fallback, reported
        in ``SampleOutput.fallback``.
    token_bitmask: int32 [B, ceil(vocab_size / 32)] in xgrammar's layout (bit v % 32 of word
        v // 32 set = id v allowed; what ``xgrammar.allocate_token_bitmask`` and
        ``GrammarMatcher.fill_next_token_bitmask`` produce). Disallowed ids get -inf; a row
        that allows nothing returns -1. Applies to greedy rows too.
    logit_bias: ``fsdist.SparseLogits(ids [B, K] int64 (-1 = empty slot), values [B, K])``,
        added to those ids' logits after the bitmask.
    penalties: ``fsdist.Penalties(repetition, frequency, presence, output_ids, prompt_ids)``
        with vLLM's meaning, after the bias (docs/semantics.md). The processors run inside
        stage 1 on each logits tile; bias and penalties cost per listed id, not per vocabulary
        id. An id out of [-1, vocab_size), a non-finite bias or penalty, or a repetition
        penalty <= 0 in a device tensor makes its row return -1 (``check=True`` raises).
    return_logprobs: also return the token's logprob (in ``logprobs_mode``) and
        logsumexp(logits / T) over the processed logits.
    top_logprobs: N in [0, 20]: also return the N most likely ids and their logprobs.
    logprobs_mode: "scaled" log_softmax(logits / T) (default), "raw" log_softmax(logits)
        or "processed" (the probability the token was drawn with, after the filters). "raw"
        cannot be combined with the logit processors (it would need the unprocessed logits
        beside the processed ones): a ValueError says so.
    config: override the tile configuration (benchmarks and tests).
    path: "fused" (logits tiles computed in the kernel), "chunked" (cuBLAS fp32 logits per
        L2-sized vocabulary chunk, then a sampling pass with the same noise: used on a GPU for
        B > 64 batches that leave much of a 128-row tile empty), or None to choose by batch size
        (see ops/configs.choose_path).
        Both draw the same noise, so they return the same tokens up to near-exact ties.
    check: also validate the values inside per-row tensors and raise ValueError on a bad
        one (this synchronises with the device; off by default, bad rows then return -1).

    Example::

        out = fsdist.sample(hidden, weight, temperature=torch.full((B,), 0.7, device="cuda"),
                            seed=seeds, offset=step, top_p=0.9, top_k=50, return_logprobs=True)
        out.tokens      # int64 [B]
    """
    validation.check_hidden(hidden)
    validation.check_weight(weight, hidden)
    validation.check_device_runnable(hidden.device)
    vocab_size = validation.check_vocab_size(vocab_size, weight.shape[0])
    validation.check_logprobs_options(top_logprobs, logprobs_mode)
    return_logprobs = validation.check_flag(return_logprobs, "return_logprobs")
    check = validation.check_flag(check, "check")
    if config is not None and not isinstance(config, TileConfig):
        raise TypeError(f"config must be a fsdist.TileConfig or None, got {type(config).__name__}")
    hidden, lead = rows.flatten_hidden(hidden)  # [..., D] -> [N, D]; the outputs get `lead` back
    rp = rows.flatten_row_args(lead, temperature=temperature, seed=seed, offset=offset, top_k=top_k, top_p=top_p,
                               min_p=min_p)
    token_bitmask, logit_bias, penalties = rows.flatten_processors(lead, token_bitmask, logit_bias, penalties)
    B, D = hidden.shape
    params, processing = proc.prepare_call_rows(
        rp["temperature"], rp["seed"], rp["offset"], B, hidden.device, top_k=rp["top_k"], top_p=rp["top_p"],
        min_p=rp["min_p"], token_bitmask=token_bitmask, logit_bias=logit_bias, penalties=penalties,
        vocab_size=vocab_size, wants_logprobs=bool(return_logprobs or top_logprobs), logprobs_mode=logprobs_mode,
        check=check)
    if processing is not None:
        params = processing.apply_to(params)
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    filtered = params.filtered(vocab_size)
    raw = return_logprobs and logprobs_mode == "raw"
    extended = filtered or top_logprobs > 0 or raw
    plan = plan_sample(batch=B, hidden_size=D, weight_rows=weight.shape[0], device=hidden.device,
                       logprobs=return_logprobs, config=config, path=path, extended=extended, dtype=hidden.dtype,
                       raw_sums=raw_sums_needed(logprobs_mode, return_logprobs, top_logprobs),
                       winner_logits=winner_logits_needed(filtered, params.may_min_p),
                       sparse_processors=proc.has_entries(params.processing))
    buffers = BufferPair.alloc(plan.layout, hidden.device)
    dev = hidden.device
    # Programmatic dependent launches (sm_90+): stage 2 launches while stage 1's last tiles run, the fallback's
    # launches while select_filtered runs; each waits for the launch before it at its first instruction, except
    # select_filtered beside the merge, which waits only before its first store (below).
    pdl2, pdl_fb = pdl_stage2(dev), pdl_fallback(dev)
    # Rows restricted by top-k / top-p get their token from select_filtered or the fallback, never from their tiles'
    # noisy winners: a tile of only such (or greedy) rows draws no noise (configs.SKIP_FILTERED_NOISE). Min-p alone
    # keeps it (select_filtered's proof from the winners reads it). Plain calls of 256 rows or more on the ws 128-row
    # tile ask too (their tiles all draw, faster with the skip's late bits: configs.SKIP_NOISE_PLAIN_WIDE_TILE).
    skip_noise = asks_noise_skip(plan, params, batch=B, filtered=filtered, vocab_size=vocab_size)
    launch_stage1(plan, hidden, weight, params, buffers, vocab_size=vocab_size, trigger=pdl2,
                  skip_filtered_noise=skip_noise)
    top_ids = top_lp = fallback = None
    # Filtered and top-N calls: select_filtered does the merge's work too where merge_folds says so (merge=True),
    # one launch less than merge + select.
    # Or, where PDL runs, select_filtered beside the merge: the merge launches first and lets select_filtered launch
    # at once; it waits for the merge only before its first store (configs.pdl_select_beside_merge).
    selects = bool(filtered or top_logprobs)  # (select_filtered runs)
    beside = selects and pdl_select_beside_merge(dev)
    fold = selects and not beside and merge_folds(plan.layout, dev)
    if fold:
        tokens = torch.empty(B, dtype=torch.int64, device=dev)
        lp = torch.empty(B, dtype=torch.float32, device=dev) if return_logprobs else None
        lse = torch.empty(B, dtype=torch.float32, device=dev) if return_logprobs else None
    else:
        tokens, lp, lse = launch_merge(plan.layout, buffers, B, params, logprobs=return_logprobs, raw=raw,
                                       pdl_wait=pdl2, trigger=beside)
    if selects:
        if top_logprobs:
            top_ids = torch.empty(B, top_logprobs, dtype=torch.int64, device=dev)
            top_lp = torch.empty(B, top_logprobs, dtype=torch.float32, device=dev)
        kept = KeptLogits(plan.layout, buffers, plan.config.block_v, torch.empty(B, dtype=torch.int64, device=dev))
        fallback = launch_select_filtered(
            plan.layout, buffers, B, params, vocab_size=vocab_size, tokens=tokens, logprobs=lp,
            top_n=top_logprobs, mode=logprobs_mode, top_ids=top_ids, top_lp=top_lp, tile_v=kept.tile_v,
            need_key=kept.need_key, winners=plan.winner_logits, merge=fold, lse=lse, raw=raw,
            pdl_wait=pdl2 and not beside, trigger=pdl_fb, late=beside)
        run_fallback(hidden, weight, params, vocab_size=vocab_size, flags=fallback,
                     tokens=tokens, kept=kept, logprobs=lp, top_n=top_logprobs, mode=logprobs_mode,
                     top_ids=top_ids, top_lp=top_lp, block_k=triton_twin(plan.config, D).block_k, pdl=pdl_fb)
    return rows.unflatten_output(SampleOutput(tokens, lp, lse, top_ids, top_lp, fallback), lead)
