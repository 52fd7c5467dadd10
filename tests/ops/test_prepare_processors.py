"""The one-launch preparation of logit bias and penalties (fsdist.ops.prepare_processors).

Against a plain-Python statement of what it must produce: per row, the bias, output and
prompt ids as ``id * 4 + kind`` entries (dropped slots: -1 ids, output ids when every
penalty is off, prompt ids when the repetition penalty is off), sorted with ties in slot
order, each bias value beside its entry; the penalties as fp32 [3, B]; the bad-row flags.
All three ways of sorting run: inside the kernel (tl.sort on 32- or 64-bit keys, a GPU's default;
slow under the interpreter, so a small batch), by rank in a second kernel (sort_entries.py, a GPU's
default for small batches of rows of more than 1,024 entries) and with torch after it; the rank sort
also alone, against torch's stable sort on rows full of equal entries.
"""
import pytest
import torch

import fsdist
import fsdist.params
import fsdist.processing
from fsdist.ops.prepare_processors import SENTINEL, default_sort, key32_fits, launch_prepare, prepare_warps
from fsdist.ops.sort_entries import RANK_SORT_MAX, launch_sort_entries, rank_sort_pays


def expected(ids, vals, out, prompt, rep, freq, pres, vocab_size):
    B = ids.shape[0]
    S = ids.shape[1] + out.shape[1] + prompt.shape[1]
    entries, values, bad = [], [], []
    for b in range(B):
        r, f, p = float(rep[b]), float(freq[b]), float(pres[b])
        rows = [(int(i) * 4, j, float(vals[b, j])) for j, i in enumerate(ids[b]) if 0 <= i < vocab_size]
        if r != 1 or f != 0 or p != 0:
            rows += [(int(i) * 4 + 1, 100 + j, 0.0) for j, i in enumerate(out[b]) if 0 <= i < vocab_size]
        if r != 1:
            rows += [(int(i) * 4 + 2, 200 + j, 0.0) for j, i in enumerate(prompt[b]) if 0 <= i < vocab_size]
        rows.sort()
        entries.append([e for e, _, _ in rows] + [SENTINEL] * (S - len(rows)))
        values.append([v for _, _, v in rows] + [0.0] * (S - len(rows)))
        tables = torch.cat([ids[b], out[b], prompt[b]])
        bad.append(bool(((tables < -1) | (tables >= vocab_size)).any()) or not r > 0
                   or bool((~torch.isfinite(vals[b]) & (ids[b] >= 0)).any()))
    return torch.tensor(entries, dtype=torch.int32), torch.tensor(values), torch.tensor(bad)


def inputs(B, V, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, V, (B, 6), generator=g)
    ids[:, 1] = ids[:, 0]  # a repeated bias id: both values, in slot order
    vals = torch.randn(B, 6, generator=g)
    out = torch.randint(-1, V, (B, 5), generator=g)
    out[:, 2] = out[:, 3]
    prompt = torch.randint(-1, V, (B, 4), generator=g)
    rep = 1 + (torch.rand(B, generator=g) > 0.5).float() * 0.3
    pres = (torch.rand(B, generator=g) > 0.5).float() * 0.5
    freq = (torch.rand(B, generator=g) > 0.5).float() * 0.25
    rep[1] = 0.0  # bad penalty
    out[2, 0] = V  # id out of range
    vals[3, 2] = float("nan")
    ids[3, 2] = 7  # a NaN value on a live slot
    return ids, vals, out, prompt, rep, freq, pres


@pytest.mark.parametrize("sort", ["torch", "bitonic", "bitonic64", "rank"])
def test_entries_values_penalties_and_bad_rows(device, sort):
    """("bitonic": 32-bit (entry, slot) keys, which fit here; "bitonic64": the 64-bit ones.)"""
    B, V = (6 if sort.startswith("bitonic") and device.type == "cpu" else 40), 500
    ids, vals, out, prompt, rep, freq, pres = inputs(B, V, seed=B)
    d = lambda t: t.to(device)  # noqa: E731
    key32 = {"bitonic": True, "bitonic64": False}.get(sort)
    got = launch_prepare(B, V, device, bias_ids=d(ids), bias_values=d(vals), output_ids=d(out), prompt_ids=d(prompt),
                         repetition=d(rep), frequency=d(freq), presence=d(pres), penalties=True,
                         sort=sort[:7] if key32 is not None else sort, key32=key32)
    entries, values, pen, bad = (t.cpu() for t in got)
    want_e, want_v, want_bad = expected(ids, vals, out, prompt, rep, freq, pres, V)
    assert torch.equal(bad, want_bad)
    good = ~want_bad
    assert torch.equal(entries[good], want_e[good])
    torch.testing.assert_close(values[good], want_v[good].float())
    assert torch.equal(pen[0], rep) and torch.equal(pen[1], freq) and torch.equal(pen[2], pres)


@pytest.mark.parametrize("temperature", ["rows", 0.7])
def test_poisoned_temperature_is_written_by_the_kernel(device, temperature):
    """temperature_out = the temperature ([B] tensor or float) with the bad rows' NaN, the rest bit for bit;
    and fsdist's processing path uses it (apply_to returns it without a launch of its own)."""
    B, V = 40, 500
    ids, vals, out, prompt, rep, freq, pres = inputs(B, V, seed=3)
    d = lambda t: t.to(device)  # noqa: E731
    t = torch.linspace(0.0, 1.5, B).to(device) if temperature == "rows" else temperature
    t_out = torch.full((B,), 123.0, device=device)
    _, _, _, bad = launch_prepare(B, V, device, bias_ids=d(ids), bias_values=d(vals), output_ids=d(out),
                                  prompt_ids=d(prompt), repetition=d(rep), frequency=d(freq), presence=d(pres),
                                  penalties=True, temperature=t,
                                  temperature_out=t_out)
    bad = bad.cpu()
    assert bad.any() and not bad.all()  # the inputs poison some rows, not all (else this could not fail)
    want = (t.cpu() if temperature == "rows" else torch.full((B,), t)).clone()
    want[bad] = float("nan")
    torch.testing.assert_close(t_out.cpu(), want, rtol=0, atol=0, equal_nan=True)
    proc = fsdist.processing.prepare_processing(
        logit_bias=fsdist.SparseLogits(d(ids), d(vals)), penalties=fsdist.Penalties(d(rep), d(freq), d(pres), d(out),
                                                                                      d(prompt)),
        batch=B, vocab_size=V, device=device, temperature=t)
    params = proc.apply_to(fsdist.params.RowParams(t, 0, 0))
    assert params.temperature is proc.temperature
    torch.testing.assert_close(params.temperature.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_bias_alone_turns_the_penalties_off(device):
    ids = torch.tensor([[3, -1, 3], [0, 1, 2]], device=device)
    vals = torch.tensor([[1.0, 9.0, 2.0], [0.5, 0.25, 0.125]], device=device)
    entries, values, pen, bad = (t.cpu() for t in launch_prepare(2, 10, device, bias_ids=ids, bias_values=vals))
    assert entries.tolist() == [[12, 12, SENTINEL], [0, 4, 8]]
    assert values.tolist() == [[1.0, 2.0, 0.0], [0.5, 0.25, 0.125]]
    assert pen.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]] and not bool(bad.any())


@pytest.mark.parametrize("S", [1, 5, 64, 130, 1000])
def test_rank_sort_is_torchs_stable_sort(device, S):
    """Few distinct entries (many ties), each slot's value distinct: the values show that equal
    entries kept their slot order. Rows of different content, a SENTINEL tail."""
    g = torch.Generator().manual_seed(S)
    B = 5
    entries = torch.randint(0, max(2, S // 8), (B, S), generator=g, dtype=torch.int32)
    entries[1, S // 2:] = SENTINEL
    entries[2] = 7  # one value throughout: only slot order decides
    values = torch.arange(B * S, dtype=torch.float32).view(B, S)
    got_e, got_v = launch_sort_entries(entries.to(device), values.to(device))
    want_e, order = torch.sort(entries, dim=1, stable=True)
    assert torch.equal(got_e.cpu(), want_e)
    assert torch.equal(got_v.cpu(), values.gather(1, order))
    # Power: an unstable order of the same entries (reversed ties) differs from the result.
    rev_e, rev_order = torch.sort(entries.flip(1), dim=1, stable=True)
    assert torch.equal(rev_e, want_e)
    if S > 1:
        assert not torch.equal(values.flip(1).gather(1, rev_order), got_v.cpu())


def test_rank_sort_refuses_rows_it_is_not_for():
    # chosen for small batches of rows of up to RANK_SORT_MAX entries only (measured crossover)
    assert rank_sort_pays(1, 3000) and rank_sort_pays(16, 3000) and rank_sort_pays(1, RANK_SORT_MAX)
    assert not rank_sort_pays(32, 3000) and not rank_sort_pays(1, RANK_SORT_MAX + 1)
    assert rank_sort_pays(1, 2000) and rank_sort_pays(10, 2000) and not rank_sort_pays(11, 2000)
    assert not rank_sort_pays(1, 1000) and not rank_sort_pays(1, 1024)
    with pytest.raises(ValueError, match="at most"):
        launch_sort_entries(torch.zeros(1, RANK_SORT_MAX + 1, dtype=torch.int32), torch.zeros(1, RANK_SORT_MAX + 1))
    with pytest.raises(ValueError, match="int32"):
        launch_sort_entries(torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="sort must be"):
        launch_prepare(1, 10, torch.device("cpu"), bias_ids=torch.zeros(1, 2, dtype=torch.int64),
                       bias_values=torch.zeros(1, 2), sort="quick")


def test_default_sort_per_device_batch_and_width():
    """The measured choice (sort_entries.py): the in-kernel sort on a GPU up to 1,024 entries at any B and
    for wide rows at larger B, the rank sort for small batches of wide rows, torch under the interpreter."""
    assert default_sort(False, 1, 1000) == "torch" and default_sort(False, 1, 3000) == "torch"
    assert [default_sort(True, b, 1000) for b in (1, 64, 256)] == ["bitonic"] * 3
    assert [default_sort(True, b, 3000) for b in (1, 22, 23)] == ["rank", "rank", "bitonic"]
    assert [default_sort(True, b, 2000) for b in (1, 10, 11)] == ["rank", "rank", "bitonic"]
    assert default_sort(True, 1, RANK_SORT_MAX + 1) == "bitonic"


def test_warps_per_row_width():
    assert prepare_warps(16) == 4 and prepare_warps(512) == 8 and prepare_warps(1024) == 16 and prepare_warps(4096) == 16


def test_32_bit_keys_only_where_they_fit():
    """(entry, slot) fits a uint32 for 4 x vocab_size x slots <= 2**32 (V = 151936: up to 4,096 slots);
    asking for 32-bit keys past that is refused, not wrapped."""
    assert key32_fits(151936, 4096) and not key32_fits(151936, 8192) and key32_fits(2**30, 1)
    assert not key32_fits(2**30 + 1, 1)
    ids = torch.zeros(1, 5000, dtype=torch.int64)
    with pytest.raises(ValueError, match="32-bit sort keys"):
        launch_prepare(1, 151936, torch.device("cpu"), bias_ids=ids, bias_values=torch.zeros(1, 5000),
                       sort="bitonic", key32=True)


def test_32_bit_keys_past_the_sign_bit(device):
    """V = 151936 and 3,500 ids a row (4,096 slots): most keys are above 2**31, where a signed key would
    sort them first. The in-kernel sort on those keys must equal torch's stable sort. (One row: each row sorts
    alone; CI time.)"""
    B, V, K, L = 1, 151936, 2000, 1000
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(V // 2, V, (B, K), generator=g)  # keys of ids >= V / 2 have the top bit set
    ids[:, :40] = torch.randint(0, 50, (B, 40), generator=g)  # and some below, with repeats
    ids[:, 40:60] = ids[:, 1000:1020]
    ids[0, 7] = -1
    out = torch.randint(-1, V, (B, L), generator=g)
    prompt = torch.randint(V // 2, V, (B, 500), generator=g)  # kind 2 (prompt) keys past the sign bit too
    prompt[:, :10] = ids[:, 1000:1010]  # the same id as a bias and a prompt entry
    vals = torch.randn(B, K, generator=g)
    d = lambda t: t.to(device)  # noqa: E731
    kw = dict(bias_ids=d(ids), bias_values=d(vals), output_ids=d(out), prompt_ids=d(prompt), repetition=1.2,
              penalties=True)
    want = launch_prepare(B, V, device, sort="torch", **kw)
    assert int((want[0][want[0] != SENTINEL].long() * 4096 >= 2**31).sum()) > 500  # (842 here)
    got = launch_prepare(B, V, device, sort="bitonic", key32=True, **kw)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("sort", ["torch", "bitonic", "rank"])
@pytest.mark.parametrize("bitmask,xor", [(False, 0), (True, "rows"), (False, 0x1234_5678_9ABC_DEF1), (True, -5)])
def test_fingerprint_is_processor_fingerprints(device, sort, bitmask, xor):
    """fingerprint_out = step_check.processor_fingerprint of the same call bit for bit (what the tensor-parallel
    header carried from a launch of its own), for each sort, with and without a bitmask, XOR an int or a [B]
    tensor; and it can fail: one entry, one bias value, one penalty or one bitmask word changed changes its row's
    fingerprint and only that row's."""
    from fsdist.ops.step_check import processor_fingerprint
    B, V = (6 if sort == "bitonic" and device.type == "cpu" else 40), 500
    ids, vals, out, prompt, rep, freq, pres = inputs(B, V, seed=11)
    ids[0, 3], vals[0, 3] = 17, -0.0  # a live -0.0 bias value: its bits count, not its value
    d = lambda t: t.to(device)  # noqa: E731
    g = torch.Generator().manual_seed(5)
    bm = d(torch.randint(-2**31, 2**31 - 1, (B, 17), generator=g, dtype=torch.int64).to(torch.int32)) if bitmask \
        else None
    x = d(torch.randint(0, 2**62, (B,), generator=g)) if xor == "rows" else xor

    def both(ids, vals, rep, bm):
        fp = torch.full((B,), 7, dtype=torch.int64, device=device)
        e, v, pen, bad = launch_prepare(B, V, device, bias_ids=d(ids), bias_values=d(vals), output_ids=d(out),
                                        prompt_ids=d(prompt), repetition=d(rep), frequency=d(freq), presence=d(pres),
                                        penalties=True, sort=sort, fingerprint_out=fp, fingerprint_xor=x, bitmask=bm)
        return fp.cpu(), processor_fingerprint(bm, e, v, pen, bad, x).cpu()

    got, want = both(ids, vals, rep, bm)
    assert torch.equal(got, want)
    assert got.unique().numel() == B
    ids2, vals2, rep2 = ids.clone(), vals.clone(), rep.clone()
    ids2[4, 0] = (ids2[4, 0] + 1) % V if ids2[4, 0] >= 0 else 3  # an entry
    vals2[5, 4] += 0.5  # a bias value (slot 4: its id is live or not, the value counts where it is)
    ids2[5, 4] = 9
    rep2[0] = rep2[0] + 0.125  # a penalty
    changed = [0, 4, 5]
    if bm is not None:
        bm = bm.clone()
        bm[2, 16] ^= 1 << 7  # a bitmask word
        changed.append(2)
    got2, want2 = both(ids2, vals2, rep2, bm)
    assert torch.equal(got2, want2)
    diff = (got2 != got).nonzero().flatten().tolist()
    assert diff == sorted(changed)


def test_fingerprint_of_a_bias_alone_and_of_a_one_word_bitmask(device):
    """A bias without penalties (the kernel's neutral 1 / 0 / 0) and a [B, 1] bitmask of any column stride (a
    transposed one passes processing.check_bitmask): processor_fingerprint's bits."""
    from fsdist.ops.step_check import processor_fingerprint
    B, V = 3, 30
    ids = torch.tensor([[3, -1, 3], [0, 1, 2], [29, 5, -1]], device=device)
    vals = torch.tensor([[1.0, 9.0, -0.0], [0.5, 0.25, 0.125], [2.0, -1.0, 0.0]], device=device)
    bm = torch.tensor([0x7FFF, -1, 12345], dtype=torch.int32, device=device).reshape(1, B).t()  # stride (1, B)
    assert bm.shape == (B, 1) and bm.stride(1) != 1
    fp = torch.empty(B, dtype=torch.int64, device=device)
    e, v, pen, bad = launch_prepare(B, V, device, bias_ids=ids, bias_values=vals, fingerprint_out=fp,
                                    fingerprint_xor=2**40 + 3, bitmask=bm)
    assert torch.equal(fp.cpu(), processor_fingerprint(bm, e, v, pen, bad, 2**40 + 3).cpu())


def test_fingerprint_arguments_are_checked(device):
    ids = torch.tensor([[3, -1]], device=device)
    vals = torch.tensor([[1.0, 2.0]], device=device)
    with pytest.raises(ValueError, match="fingerprint_out"):
        launch_prepare(1, 10, device, bias_ids=ids, bias_values=vals,
                       fingerprint_out=torch.empty(1, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="fingerprint_xor"):
        launch_prepare(1, 10, device, bias_ids=ids, bias_values=vals,
                       fingerprint_out=torch.empty(1, dtype=torch.int64, device=device),
                       fingerprint_xor=torch.zeros(2, dtype=torch.int64, device=device))


def test_processing_hands_the_kernels_fingerprint_to_row_fingerprint(device, monkeypatch):
    """prepare_processing(fingerprint_xor=x): row_fingerprint(x) is the preparation kernel's tensor (no launch);
    another xor falls back to processor_fingerprint's launch, with the same bits as XORing the difference."""
    B, V = 40, 500
    ids, vals, out, prompt, rep, freq, pres = inputs(B, V, seed=2)
    d = lambda t: t.to(device)  # noqa: E731
    x = d(torch.arange(B, dtype=torch.int64) * 0x9E3779B97F4A7C1)
    proc = fsdist.processing.prepare_processing(
        logit_bias=fsdist.SparseLogits(d(ids), d(vals)), penalties=fsdist.Penalties(d(rep), d(freq), d(pres), d(out),
                                                                                      d(prompt)),
        token_bitmask=d(torch.full((B, 16), -1, dtype=torch.int32)), batch=B, vocab_size=V, device=device,
        fingerprint_xor=x)
    assert proc.row_fingerprint(x) is proc.fingerprint
    with monkeypatch.context() as m:  # the kernel's tensor, not processor_fingerprint's launch
        m.setattr(fsdist.processing, "processor_fingerprint", lambda *a, **k: pytest.fail("launched"))
        params, via_call = fsdist.processing.prepare_call_rows(
            0.7, 1, 0, B, device, top_k=0, top_p=1.0, min_p=0.0, token_bitmask=None,
            logit_bias=fsdist.SparseLogits(d(ids), d(vals)), penalties=None, vocab_size=V, wants_logprobs=False,
            logprobs_mode="scaled", check=False, filters_fingerprint_of=lambda p: x)
        assert params.fingerprint is x
        assert via_call.row_fingerprint(params.fingerprint) is via_call.fingerprint
    other = proc.row_fingerprint(5)
    assert other is not proc.fingerprint
    assert torch.equal((other ^ 5).cpu(), (proc.fingerprint ^ x).cpu())
    plain = fsdist.processing.prepare_processing(
        logit_bias=fsdist.SparseLogits(d(ids), d(vals)), batch=B, vocab_size=V, device=device)
    assert plain.fingerprint is None
