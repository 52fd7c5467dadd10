"""A real decode loop with fsdist as the LM head: a Hugging Face causal LM with random weights.

    python examples/generate.py                 # real size on a GPU, small on CPU
    python examples/generate.py --size small --modes greedy sampled grammar

The model is a transformers ``LlamaForCausalLM`` built from a config (no download), its
weights drawn with ``torch.manual_seed``. Each step runs the base model with a KV cache and
samples the next token with ``fsdist.sample`` on the last hidden state and ``lm_head.weight``
(``fsdist.integrations.transformers.generate``): the logits are never written.

* greedy:  B prompts, tokens equal ``model.generate(do_sample=False)`` (checked), and the
           time per generated token of both;
* sampled: temperature, top-k, top-p, min-p and repetition/frequency/presence penalties
           over the growing output, per-row seeds; a row sampled alone gives what it gave
           in the batch (the noise is keyed by seed and position);
* grammar: an xgrammar ``GrammarMatcher`` per row for a JSON schema over a synthetic
           vocabulary of strings fills the token bitmask each step; every token is accepted,
           and the text parses as JSON of the schema (skipped when xgrammar is missing).

Sizes: "small" (hidden 64, 2 layers, V = 512) runs under Triton's interpreter in the main
job; "real" (hidden 4096, 4 layers, V = 128256 as Llama 3) on one GPU. float32 by default:
model.generate takes the argmax of logits rounded to the model's dtype, fsdist of fp32
logits, so in bf16 (--dtype bfloat16) a near-tie may go either way and only agreement is
reported.
"""
import argparse
import json
import random
import time

import torch

import fsdist
from fsdist.integrations.transformers import XGrammarConstraint, generate, lm_head_weight

SIZES = {
    "small": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512),
    "real": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256),
}
EOS = 0  # the synthetic vocabulary's "</s>"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "color", "count", "ok"],
    "additionalProperties": False,
}


def build_model(size: str = "small", seed: int = 0, device="cpu", dtype=torch.float32):
    """A LlamaForCausalLM with random weights (torch.manual_seed(seed)), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SIZES[size], max_position_embeddings=1024, bos_token_id=1, eos_token_id=EOS,
                         pad_token_id=EOS, tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def json_vocabulary(vocab_size: int, seed: int = 0):
    """vocab_size strings: "</s>" (id 0, the stop token), the printable ASCII characters, JSON
    and schema fragments, then random lowercase words. A RAW xgrammar vocabulary."""
    vocab = ["</s>"] + [chr(c) for c in range(32, 127)]
    vocab += ['{"', '":', '":"', '","', '"}', '},', 'true', 'false', 'null', 'name', 'color', 'count', 'ok',
              'red', 'green', 'blue'] + [str(n) for n in range(10, 100)]
    rng, seen = random.Random(seed), set(vocab)
    while len(vocab) < vocab_size:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 6)))
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    return vocab[:vocab_size]


def check_schema(obj) -> None:
    """Raise AssertionError unless obj is an instance of SCHEMA (the parts it uses)."""
    assert isinstance(obj, dict) and set(obj) == set(SCHEMA["required"]), obj
    assert isinstance(obj["name"], str) and 1 <= len(obj["name"]) <= 8, obj
    assert obj["color"] in ("red", "green", "blue"), obj
    assert isinstance(obj["count"], int) and not isinstance(obj["count"], bool) and 0 <= obj["count"] <= 99, obj
    assert isinstance(obj["ok"], bool), obj


def grammar_matchers(vocab, batch: int, schema=SCHEMA):
    import xgrammar as xgr

    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=[EOS])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                             separators=(",", ":"))
    return [xgr.GrammarMatcher(compiled) for _ in range(batch)]


def decode_json(model, vocab, *, batch=2, temperature=None, seed=None, max_new_tokens=64, **kw):
    """Grammar-constrained generation from a one-token prompt; returns (texts, matchers)."""
    device = model.device
    matchers = grammar_matchers(vocab, batch)
    prompt = torch.full((batch, 1), 1, dtype=torch.int64, device=device)
    temperature = torch.tensor([0.0] + [1.0] * (batch - 1), device=device) if temperature is None else temperature
    seed = torch.arange(batch, device=device) + 7 if seed is None else seed
    seq = generate(model, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                   constraint=XGrammarConstraint(matchers), eos_token_id=EOS, **kw)
    texts = ["".join(vocab[t] for t in row if t != EOS) for row in seq[:, 1:].tolist()]
    return texts, matchers


def _time(fn, warmup: bool = False):
    """(fn(), seconds). warmup: call fn once first, untimed, so that Triton's and torch's
    first-call compilation stays out of the figure (done on a GPU, where it dominates)."""
    if warmup:
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def run_greedy(model, batch, prompt_len, steps, log):
    device = model.device
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, model.config.vocab_size, (batch, prompt_len), generator=g).to(device)
    # Both stop at the model's eos id and pad finished rows with it (model.generate's rules).
    gpu = device.type == "cuda"
    ours, t_ours = _time(lambda: generate(model, prompt, max_new_tokens=steps), warmup=gpu)
    theirs, t_hf = _time(lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                                max_new_tokens=steps), warmup=gpu)
    same = torch.equal(ours, theirs)
    log(f"  greedy, B={batch}, {steps} tokens: fsdist {t_ours / steps * 1e3:.1f} ms/token, "
        f"model.generate {t_hf / steps * 1e3:.1f} ms/token; tokens equal: {same}")
    log(f"  row 0: {ours[0, prompt_len:].tolist()[:16]}{' ...' if steps > 16 else ''}")
    if same:
        return
    if model.dtype == torch.float32:
        raise SystemExit("greedy tokens differ from model.generate(do_sample=False)")
    # model.generate takes the argmax of logits rounded to the model's dtype; fsdist of fp32
    # logits. In bf16 a near-tie can round either way, and the rows then go their own ways.
    rows = [int(torch.equal(a, b)) for a, b in zip(ours, theirs)]
    log(f"  ({sum(rows)} of {batch} rows equal: in {str(model.dtype).replace('torch.', '')} model.generate "
        f"compares rounded logits; equality is checked in float32)")


def run_sampled(model, batch, prompt_len, steps, log):
    device = model.device
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, model.config.vocab_size, (batch, prompt_len), generator=g).to(device)
    gpu = device.type == "cuda"
    # Under the interpreter (CPU) a row whose filtered set the kernel's kept logits (4 per
    # vocabulary tile) cannot prove costs seconds in the exact fallback; top-k <= 4 is always
    # proven, so the small run uses that. On a GPU the fallback costs microseconds.
    top_k = 50 if gpu else 4
    kw = dict(max_new_tokens=steps, temperature=0.8, top_k=top_k, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
              frequency_penalty=0.3, presence_penalty=0.3, eos_token_id=[])
    seeds = torch.arange(batch, device=device) * 1000 + 5
    seq, t = _time(lambda: generate(model, prompt, seed=seeds, **kw), warmup=gpu)
    log(f"  sampled (T=0.8, top-k {top_k}, top-p 0.9, min-p 0.02, penalties on the growing output), B={batch}, "
        f"{steps} tokens: {t / steps * 1e3:.1f} ms/token")
    for b in range(min(batch, 2)):
        log(f"  row {b}: {seq[b, prompt_len:].tolist()[:16]}{' ...' if steps > 16 else ''}")
    # fsdist's own batch invariance, on this model's real hidden states: each row's last hidden
    # state sampled alone gives the token the whole batch gives it (noise keyed by seed and position).
    with torch.inference_mode():
        hidden = model.base_model(input_ids=seq).last_hidden_state[:, -1, :].contiguous()
    weight = lm_head_weight(model)
    one = dict(temperature=0.8, top_k=top_k, top_p=0.9, min_p=0.02, offset=seq.shape[1])
    together = fsdist.sample(hidden, weight, seed=seeds, **one).tokens
    apart = torch.cat([fsdist.sample(hidden[b:b + 1].clone(), weight, seed=seeds[b:b + 1], **one).tokens
                       for b in range(batch)])
    log(f"  each row's hidden state sampled alone = sampled in the batch: {torch.equal(together, apart)}")
    if not torch.equal(together, apart):
        raise SystemExit("fsdist gave a row another token alone than in the batch")
    # Whole decodes: a row decoded alone matches the batch only if the model's own forward is
    # batch-invariant. On a CPU it is here; on a GPU cuBLAS picks other kernels for other batch
    # sizes, the hidden states differ in their last bits, and the decodes may part ways.
    alone = generate(model, prompt[:1], seed=seeds[:1], **kw)
    same = torch.equal(alone[0], seq[0])
    log(f"  row 0 decoded alone = row 0 decoded in the batch: {same}"
        + ("" if same or not gpu else " (the model's forward is not batch-invariant on this GPU; see above for fsdist's)"))
    if not same and not gpu:
        raise SystemExit("a row's tokens depend on the rest of the batch")


def run_grammar(model, log):
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        log("  grammar: skipped (xgrammar is not installed: pip install -e '.[grammar]')")
        return
    vocab = json_vocabulary(model.config.vocab_size)
    (texts, matchers), t = _time(lambda: decode_json(model, vocab, batch=2))
    log(f"  grammar (JSON schema via xgrammar, row 0 greedy, row 1 T=1): {t:.1f} s")
    for b, (text, m) in enumerate(zip(texts, matchers)):
        obj = json.loads(text)
        check_schema(obj)
        log(f"  row {b}: {text}   (terminated: {m.is_terminated()}, parses, matches the schema)")


def main(argv=None):
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(SIZES), default="real" if gpu else "small")
    ap.add_argument("--modes", nargs="+", choices=["greedy", "sampled", "grammar"],
                    default=["greedy", "sampled", "grammar"])
    ap.add_argument("--batch", type=int, default=8 if gpu else 2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64 if gpu else 8)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="model dtype; greedy equality with model.generate is checked in float32")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, flush=True)

    device = "cuda" if gpu else "cpu"
    dtype = getattr(torch, args.dtype)
    model, t = _time(lambda: build_model(args.size, device=device, dtype=dtype))
    cfg = model.config
    log(f"decode loop: random-weight Llama, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
        f"V={cfg.vocab_size}, {str(dtype).replace('torch.', '')} on {device} (built in {t:.1f} s)")
    if "greedy" in args.modes:
        run_greedy(model, args.batch, args.prompt_len, args.steps, log)
    if "sampled" in args.modes:
        run_sampled(model, args.batch, args.prompt_len, args.steps, log)
    if "grammar" in args.modes:
        run_grammar(model, log)


if __name__ == "__main__":
    main()
