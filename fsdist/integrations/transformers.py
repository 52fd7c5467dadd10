"""Hugging Face ``transformers`` -> fsdist: a decode loop whose LM head is fsdist sampling.

A causal LM computes ``logits = lm_head(hidden)`` and its sampler reads them back.
:func:`generate` runs the model's base (``model.base_model``: embeddings, layers, final
norm) with a KV cache, takes the last position's hidden state and calls
:func:`fsdist.sample` with the LM head's weight, so the ``[B, V]`` logits are never
written::

    from fsdist.integrations.transformers import generate, XGrammarConstraint

    seq = generate(model, input_ids, max_new_tokens=32)                  # greedy
    # == model.generate(input_ids, do_sample=False, max_new_tokens=32)

    seq = generate(model, input_ids, max_new_tokens=32, temperature=0.8, top_k=50, top_p=0.9,
                   repetition_penalty=1.1, seed=torch.tensor([1, 2]))
    seq = generate(model, input_ids, max_new_tokens=64, temperature=0.7,
                   constraint=XGrammarConstraint(matchers))             # one xgrammar matcher per row

``input_ids`` is ``[B, P]`` int64 without padding (every prompt P tokens); the result is
``[B, P + T]`` like ``model.generate``'s, T <= max_new_tokens. The sampling parameters have
fsdist's (= vLLM V1's) meaning, docs/semantics.md, not transformers' logits processors':
penalties apply to the prompt's and the generated ids (frequency and presence to the
generated ones only), temperature comes before min-p, top-k and top-p. The noise of row b at
step t is keyed by ``(seed_b, P + t)``, the position of the token being sampled, so a row's
tokens do not depend on the other rows of the batch.

Stopping follows ``model.generate``: a row that emits ``eos_token_id`` (default: the
model's generation config) is finished, later steps write ``pad_token_id`` (default: the
first eos id) into it, and the loop ends when every row is finished.

Models whose logits are not ``hidden @ lm_head.weight.T`` (a bias in the LM head, Gemma's
``final_logit_softcapping``, Cohere's ``logit_scale``) raise ValueError naming the reason.
``transformers`` itself is not imported here: the functions take a model instance.
"""
from typing import List, Optional, Sequence, Union

import torch

from ..sampling import sample
from ..types import Penalties

Row = Union[float, int, torch.Tensor]


def lm_head_weight(model) -> torch.Tensor:
    """The ``[V, D]`` weight of a causal LM's output layer, after checking that its logits
    are exactly ``hidden @ weight.T``."""
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no output embedding (LM head) weight")
    if getattr(head, "bias", None) is not None:
        raise ValueError(f"{type(model).__name__}'s LM head has a bias: fsdist samples hidden @ weight.T only")
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("encoder-decoder models are not supported: generate() drives a decoder-only base model")
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        value = getattr(config, name, None)
        if value not in (None, 0, 1, 1.0):
            raise ValueError(f"{type(model).__name__} transforms its logits (config.{name}={value}): "
                             "fsdist samples hidden @ weight.T only")
    return head.weight if head.weight.is_contiguous() else head.weight.contiguous()


class XGrammarConstraint:
    """One ``xgrammar.GrammarMatcher`` per row: each step fills the rows' token bitmask
    (xgrammar's int32 layout, the one ``token_bitmask=`` takes) and accepts the sampled
    tokens; a token the grammar rejects raises RuntimeError. Rows whose matcher has
    terminated (it accepted a stop token) are left unconstrained (all ones)."""

    def __init__(self, matchers: Sequence):
        self.matchers = list(matchers)

    def fill_bitmask(self, bitmask: torch.Tensor) -> None:
        for row, matcher in enumerate(self.matchers):
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, tokens: List[int], active: List[bool]) -> None:
        for row, (matcher, token, live) in enumerate(zip(self.matchers, tokens, active)):
            if live and not matcher.is_terminated() and not matcher.accept_token(token):
                raise RuntimeError(f"row {row}: the grammar rejected token {token}")


def _eos_ids(model, eos_token_id) -> List[int]:
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]


@torch.inference_mode()
def generate(model, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: Row = 0.0, seed: Row = 0,
             top_k: Row = 0, top_p: Row = 1.0, min_p: Row = 0.0, repetition_penalty: Row = 1.0,
             frequency_penalty: Row = 0.0, presence_penalty: Row = 0.0, constraint=None,
             eos_token_id: Optional[Union[int, Sequence[int]]] = None, pad_token_id: Optional[int] = None,
             use_cache: bool = True, **sample_kwargs) -> torch.Tensor:
    """Decode up to ``max_new_tokens`` tokens per row with fsdist as the LM head (see the
    module docstring). ``temperature`` 0 is greedy. Scalars or ``[B]`` tensors on the
    model's device, as in :func:`fsdist.sample`. ``constraint``: an object with
    ``fill_bitmask(bitmask int32 [B, ceil(V/32)])`` and ``accept(tokens, active)``, such as
    :class:`XGrammarConstraint`. ``sample_kwargs`` go to :func:`fsdist.sample` as they are
    (``logit_bias``, ``config``, ...); ``vocab_size`` among them (default: the head's rows) keeps a padded
    head's extra rows from ever being sampled and sizes the constraint's bitmask. ``seed`` 0 (the default)
    is every row's and every call's seed: identical prompts sampled at T > 0 then continue identically on
    every run (the RNG contract); pass per-row or per-call seeds for independent draws. Returns
    ``[B, P + T]`` int64."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.int64:
        raise TypeError("input_ids must be an int64 tensor [B, P] (prompts of equal length, no padding)")
    weight = lm_head_weight(model)
    vocab_size = sample_kwargs.pop("vocab_size", None)
    if vocab_size is None:
        vocab_size = weight.shape[0]
    base = model.base_model
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    eos = _eos_ids(model, eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else None)
    penalized = any(isinstance(x, torch.Tensor) or x != off for x, off in
                    ((repetition_penalty, 1.0), (frequency_penalty, 0.0), (presence_penalty, 0.0)))
    bitmask = None
    if constraint is not None:
        bitmask = torch.empty(batch, (vocab_size + 31) // 32, dtype=torch.int32)

    sequences = input_ids
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    past, step_input = None, input_ids
    for step in range(max_new_tokens):
        out = base(input_ids=step_input, past_key_values=past, use_cache=use_cache)
        hidden = out.last_hidden_state[:, -1, :].contiguous()
        if use_cache:
            past = out.past_key_values
        kw = dict(sample_kwargs)
        if penalized:
            generated = sequences[:, prompt_len:]
            kw["penalties"] = Penalties(repetition_penalty, frequency_penalty, presence_penalty,
                                        output_ids=generated if step else None, prompt_ids=input_ids)
        if bitmask is not None:
            bitmask.fill_(-1)
            constraint.fill_bitmask(bitmask)
            kw["token_bitmask"] = bitmask.to(device, non_blocking=True)
        tokens = sample(hidden, weight, temperature=temperature, seed=seed, offset=prompt_len + step,
                        vocab_size=vocab_size, top_k=top_k, top_p=top_p, min_p=min_p, **kw).tokens
        if pad is not None:
            tokens = torch.where(unfinished, tokens, pad)
        if bool((tokens < 0).any()):  # a NaN hidden state, or a bitmask that allows nothing
            raise RuntimeError(f"fsdist could not sample rows {(tokens < 0).nonzero().flatten().tolist()} "
                               f"at step {step} (token -1: see fsdist.SampleOutput)")
        if constraint is not None:
            constraint.accept(tokens.tolist(), unfinished.tolist())
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        step_input = tokens[:, None] if use_cache else sequences
        if eos:
            unfinished &= ~torch.isin(tokens, torch.tensor(eos, device=device))
            if not bool(unfinished.any()):  # the one host sync per step, as in model.generate
                break
    return sequences


__all__ = ["XGrammarConstraint", "generate", "lm_head_weight"]
