"""Grammar-constrained sampling: an xgrammar GrammarMatcher fills fsdist's token bitmask.

Skipped when xgrammar is not installed. The vocabulary is synthetic (examples/generate.py's
json_vocabulary: printable characters, JSON fragments and random words, id 0 the stop
token), the grammar a JSON schema (an object with a bounded string, an enum, a bounded
integer and a boolean; compact separators). Each step the matcher of every row fills its
row of the bitmask, fsdist samples with it (greedy and sampled rows, with and without
filters), and the matcher must accept every sampled token; at the end every row has
terminated and its text parses as JSON of the schema.

* with random hidden states standing in for a model (xgrammar alone), and
* with a random-weight transformers Llama through fsdist.integrations.transformers.generate
  (skipped without transformers).
"""
import json
import math

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

import fsdist  # noqa: E402
from fsdist.reference import allowed_from_bitmask  # noqa: E402
from generate_example import load_generate_example  # noqa: E402


@pytest.fixture(scope="module")
def example():
    return load_generate_example()

V, D = 512, 32


def test_the_matchers_bitmask_is_fsdists_layout(example):
    """A matcher's bitmask, as fsdist.sample's token_bitmask, allows exactly the grammar's ids:
    greedy picks the best allowed id, and a draw never leaves the allowed set."""
    vocab = example.json_vocabulary(V)
    matchers = example.grammar_matchers(vocab, batch=2)
    assert matchers[1].accept_string('{"name":"ab')  # row 1 is inside the string: almost anything goes
    bitmask = xgr.allocate_token_bitmask(2, V)
    for b, m in enumerate(matchers):
        m.fill_next_token_bitmask(bitmask, b)
    allowed = allowed_from_bitmask(bitmask, V)
    assert allowed[0].nonzero().flatten().tolist() == [vocab.index("{"), vocab.index('{"')]
    assert 400 < int(allowed[1].sum()) < V
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, D, generator=g), torch.randn(V, D, generator=g) / math.sqrt(D)
    greedy = fsdist.sample(hidden, weight, temperature=0.0, token_bitmask=bitmask).tokens
    logits = (hidden @ weight.T).masked_fill(~allowed, float("-inf"))
    assert torch.equal(greedy, logits.argmax(dim=1))
    many = fsdist.sample(hidden[1:].expand(2000, D).contiguous(), weight, temperature=1.0,
                         seed=torch.arange(2000), token_bitmask=bitmask[1:].expand(2000, -1).contiguous()).tokens
    assert bool(allowed[1][many].all())


def test_json_schema_with_random_hidden_states(example):
    """The decode loop without a model: fresh random hidden states each step."""
    vocab = example.json_vocabulary(V)
    batch = 4
    matchers = example.grammar_matchers(vocab, batch)
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3])
    # Row 2 filtered: top-k <= 4 (the kernel keeps 4 logits per tile) is always proven in the
    # kernel, so no row pays the exact fallback, which costs seconds under the interpreter.
    filters = dict(top_k=torch.tensor([0, 0, 4, 0], dtype=torch.int32), top_p=torch.tensor([1.0, 1.0, 0.9, 1.0]))
    texts, steps = [[] for _ in range(batch)], 0
    bitmask = xgr.allocate_token_bitmask(batch, V)
    while not all(m.is_terminated() for m in matchers):
        assert steps < 80, f"no end after {steps} steps: {texts}"
        for b, m in enumerate(matchers):
            if not m.is_terminated():
                m.fill_next_token_bitmask(bitmask, b)
        hidden = torch.randn(batch, D, generator=g)
        out = fsdist.sample(hidden, weight, temperature=temperature, seed=torch.arange(batch) + 100, offset=steps,
                            token_bitmask=bitmask, **filters)
        for b, (m, t) in enumerate(zip(matchers, out.tokens.tolist())):
            if not m.is_terminated():
                assert m.accept_token(t), f"row {b}: the grammar rejected {vocab[t]!r} after {''.join(texts[b])!r}"
                if t != example.EOS:
                    texts[b].append(vocab[t])
        steps += 1
    for text in texts:
        example.check_schema(json.loads("".join(text)))
    print(f"{steps} steps: " + " | ".join("".join(t) for t in texts))


def test_json_schema_with_a_transformers_model(example):
    pytest.importorskip("transformers")
    model = example.build_model("small")
    vocab = example.json_vocabulary(model.config.vocab_size)
    texts, matchers = example.decode_json(model, vocab, batch=2, max_new_tokens=64)
    for text, m in zip(texts, matchers):
        assert m.is_terminated(), text
        example.check_schema(json.loads(text))
    print(" | ".join(texts))
