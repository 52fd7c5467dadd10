"""Every kernel variant compiles with Triton's real compiler, to an sm_90 cubin, without a GPU.

Under TRITON_INTERPRET=1 kernels run as Python, which accepts things the compiler
rejects (e.g. a plain-int module global read inside @triton.jit code, or a scalar
argument reassigned with another type). So each kernel of fsdist.ops.group_select, and
stage 1 (fused kernel and chunked path's pass) / stage 2 with the peer table and the device
parity (the head's variants), is
lowered to Triton IR for an sm_90 target in a subprocess with the interpreter off: no GPU
is needed for that step, and a failure here would otherwise only show up on the GPU machine.
One subprocess lowers every case (``lower_all``), reporting each on its own line: on a cold
Triton cache the compiles take ~5 min of a CI core, and a process per case added ~2.5 s of
start-up to each.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch


_LOWER = r"""
import json, re, sys, importlib, traceback
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


class CheckFailed(Exception):
    pass


def lower(spec):
    fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
    names = fn.arg_names
    sig = {n: ("constexpr" if n in spec["constexprs"] else spec["types"][n]) for n in names}
    consts = {(names.index(n),): v for n, v in spec["constexprs"].items()}
    # "divisible": as a GPU launch specialises aligned arguments (16-byte pointers, integers divisible by 16), which
    # changes vectorisation and layouts: some compiler failures show only then.
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if spec.get("divisible")
             and n not in spec["constexprs"] and (spec["types"][n].startswith("*") or spec["types"][n] == "i32")}
    options = dict(num_warps=spec.get("num_warps", 4))
    source = ASTSource
    if spec.get("gluon"):  # a Gluon kernel (fused_sample_ws): its tensor descriptors carry their shared-memory layout
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon._runtime import GluonASTSource
        nvmma = repr(gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
        sig = {n: (t.replace("NVMMA", nvmma) if isinstance(t, str) else t) for n, t in sig.items()}
        source = GluonASTSource
        options["maxnreg"] = spec["maxnreg"]
    # All the way to a cubin (Triton's wheel carries ptxas): GPU-only compiler failures show up here.
    k = triton.compile(source(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=options)
    # optional PTX checks: instructions a variant must (ptx_has) or must not (ptx_lacks) contain
    missing = [t for t in spec.get("ptx_has", []) if t not in k.asm["ptx"]]
    present = [t for t in spec.get("ptx_lacks", []) if t in k.asm["ptx"]]
    if missing or present:
        raise CheckFailed(f"PTX check failed: missing {missing}, unexpected {present}")
    # optional counts: instructions a variant must contain exactly this many times (ptx_count)
    counts = {t: k.asm["ptx"].count(t) for t in spec.get("ptx_count", {})}
    if counts != spec.get("ptx_count", {}):
        raise CheckFailed(f"PTX check failed: counts {counts}, expected {spec['ptx_count']}")
    # wait_first: a programmatic dependent's griddepcontrol.wait comes before every global memory access in the PTX
    # (the compiler may not hoist a load above it: an early load could read what the launch before it still writes)
    if spec.get("wait_first"):
        ptx = k.asm["ptx"]
        wait = ptx.find("griddepcontrol.wait")
        # (instructions only: an optional predicate, then the opcode; ".loc" comments name files like "filtered.py")
        first = re.search(r"^\s*(@!?%p\d+\s+)?((ld|st)(\.[a-z0-9]+)*\.global|atom\.|red\.|cp\.async)", ptx, re.M)
        if wait < 0 or (first is not None and first.start() < wait):
            raise CheckFailed("PTX check failed: a global memory access precedes griddepcontrol.wait")
    # late_wait: a kernel that waits late (select_filtered beside the merge): some global load (stage 1's candidates)
    # comes before the first griddepcontrol.wait, and every 64-bit global load (the merge's int64 tokens: the cases turn
    # the per-row int64 seed / offset off) after a wait in the text (a heuristic of program order: each branch's wait
    # precedes its own reads of the verdict)
    if spec.get("late_wait"):
        ptx = k.asm["ptx"]
        waits = [m.start() for m in re.finditer("griddepcontrol.wait", ptx)]
        loads = [m.start() for m in re.finditer(r"^\s*(@!?%p\d+\s+)?ld(\.[a-z0-9]+)*\.global(\.[a-z0-9]+)*", ptx, re.M)]
        wide = [m.start() for m in re.finditer(r"^\s*(@!?%p\d+\s+)?ld(\.[a-z0-9]+)*\.global(\.[a-z0-9]+)*\.[bsu]64",
                                               ptx, re.M)]
        if not waits or not loads or loads[0] > waits[0]:
            raise CheckFailed("PTX check failed: no global load before the late griddepcontrol.wait")
        if not wide or wide[0] < waits[0]:
            raise CheckFailed("PTX check failed: a 64-bit global load (the verdict) precedes griddepcontrol.wait")
    return len(k.asm["cubin"])


# One process lowers every case it is given (a JSON object, name -> spec, on stdin): the interpreter's start-up and
# the imports are paid once, not once per case. One line per case, written as soon as it is done.
for name, spec in json.load(sys.stdin).items():
    print("START " + name, flush=True)  # (a case that starts and never reports crashed the process)
    try:
        result = dict(case=name, ok=True, msg=f"COMPILED {spec['kernel']} {lower(spec)}")
    except CheckFailed as e:
        result = dict(case=name, ok=False, msg=str(e))
    except Exception:
        result = dict(case=name, ok=False, msg=traceback.format_exc()[-4000:])
    print("RESULT " + json.dumps(result), flush=True)
"""

ROW_PARAMS = {"seed_ptr": "*i64", "seed_val": "i64", "offset_ptr": "*i64", "offset_val": "i64",
              "temp_ptr": "*fp32", "temp_val": "fp32"}
PARITY = {"parity_ptr": "*i64", "parity_stride_f": "i32", "parity_stride_i": "i32"}
CHECK = {"me": "i32", "status_ptr": "*i32", "fp_slot": "i32", "rec_slot": "i32"}
# the logit processors (fsdist.ops.processors), every switch on
PROC = {"bm_ptr": "*i32", "bm_stride": "i32", "ent_ptr": "*i32", "val_ptr": "*fp32", "ent_stride": "i32",
        "ent_width": "i32", "search_steps": "i32", "pen_ptr": "*fp32", "pen_stride": "i32"}
PROC_CONST = dict(BITMASK=True, SPARSE=True, PINNED=True)  # PINNED: the mul.rn products too
STAGE1 = dict(h_ptr="*bf16", w_ptr="*bf16", cand_f="*i64",
              cand_i="*i64", B="i32", D="i32", V_rows="i32", vocab_size="i32", vocab_start="i32", stride_hb="i32",
              buf_offset="i32", buf_offset_i="i32", stride_field="i32", stride_slot="i32", hdr_off_i="i32", flags="i32",
              stride_ifield="i32", xfp_ptr="*i64", xfp_val="i64", eoff_ptr="*i32", eoff_stride="i32", head_ptr="*i32",
              head_val_ptr="*fp32", head_stride="i32", first_wave="i32", stagger_ns="i32", topk_ptr="*i32",
              topk_val="i32", topp_ptr="*fp32", topp_val="fp32", **ROW_PARAMS, **PARITY, **PROC)
STAGE1_CONST = dict(**PROC_CONST, BLOCK_B=16, BLOCK_V=128, BLOCK_K=128, EVEN_K=True, EVEN_V=True, SEED_PER_ROW=True,
                    OFFSET_PER_ROW=True, TEMP_PER_ROW=True, NOISE=True, LOGPROBS=True, PEER_TABLE=True, NPEERS=4,
                    DOT_PRECISION="tf32", DOT_UPCAST=False, FAST_LOG=True, DEVICE_PARITY=True, TMA=False, HEADER=True,
                    EXTENDED=True, KEEP=4, XFP_PER_ROW=True, ENTRY_HEAD=4, BM_WORDS=True, WINNER_LOGIT=True,
                    RAW_SUM=True, STAGGER=False, PDL_WAIT=False, TRIGGER=False, SKIP_NOISE=False, TOPK_PER_ROW=False,
                    TOPP_PER_ROW=False)

CASES = {
    "group_select": dict(
        module="fsdist.ops.group_select", kernel="group_select_kernel",
        types=dict(ex_f="*fp32", ex_i="*i32", base_f="i32", base_i="i32", stride_rank="i32", stride_field="i32",
                   stride_rank_i="i32", n_ranks="i32", tokens_ptr="*i64", logprob_ptr="*fp32", lse_ptr="*fp32",
                   B="i32", **ROW_PARAMS, **PARITY, **CHECK),
        constexprs=dict(BLOCK_R=128, SEED_PER_ROW=True, OFFSET_PER_ROW=False, TEMP_PER_ROW=True, NOISE=True,
                        STREAM=1, DEVICE_PARITY=True, CHECK=True, NW=4)),
    "group_publish_peers": dict(
        module="fsdist.ops.group_select", kernel="group_publish_kernel",
        types=dict(tok_ptr="*i64", lp_ptr="*fp32", stats_ptr="*fp32", dst_f="*i64", dst_i="*i64", off_f="i32",
                   off_i="i32", stride_field="i32", B="i32", hdr_off_i="i32", rec_off_i="i32", flags="i32",
                   **ROW_PARAMS, **PARITY),
        constexprs=dict(BLOCK=128, PEER_TABLE=True, NPEERS=4, DEVICE_PARITY=True, SEED_PER_ROW=True,
                        OFFSET_PER_ROW=True, TEMP_PER_ROW=True, HEADER=True)),
    "group_publish_local": dict(
        module="fsdist.ops.group_select", kernel="group_publish_kernel",
        types=dict(tok_ptr="*i64", lp_ptr="*fp32", stats_ptr="*fp32", dst_f="*fp32", dst_i="*i32", off_f="i32",
                   off_i="i32", stride_field="i32", B="i32", hdr_off_i="i32", rec_off_i="i32", flags="i32",
                   **ROW_PARAMS, **PARITY),
        constexprs=dict(BLOCK=128, PEER_TABLE=False, NPEERS=1, DEVICE_PARITY=False, SEED_PER_ROW=False,
                        OFFSET_PER_ROW=False, TEMP_PER_ROW=False, HEADER=False)),
    "stage1_fused_peers_parity": dict(  # (no first-wave stagger: no timer read)
        module="fsdist.ops.fused_sample", kernel="fused_sample_kernel", types=STAGE1, constexprs=STAGE1_CONST,
        ptx_lacks=["%globaltimer", "nanosleep", "griddepcontrol"]),  # (nor a PDL wait: v73)
    "stage1_fused_tma": dict(  # the operands as tensor descriptors (TileConfig.tma)
        module="fsdist.ops.fused_sample", kernel="fused_sample_kernel",
        types=dict(STAGE1, h_ptr="tensordesc<bf16[64, 64]>", w_ptr="tensordesc<bf16[128, 64]>"),
        # (and the extended epilogue without the raw sums and the winner's logit: filters, no logprobs)
        constexprs=dict(STAGE1_CONST, BLOCK_B=64, BLOCK_K=64, EVEN_K=False, EVEN_V=False, TMA=True,
                        WINNER_LOGIT=False, RAW_SUM=False)),
    "stage1_fused_stagger": dict(  # the first-wave stagger (TileConfig.stagger_us): PTX timer reads and sleeps
        module="fsdist.ops.fused_sample", kernel="fused_sample_kernel", types=STAGE1,
        constexprs=dict(STAGE1_CONST, PEER_TABLE=False, NPEERS=1, DEVICE_PARITY=False, HEADER=False, STAGGER=True),
        ptx_has=["%globaltimer", "nanosleep.u32"]),
    "stage1_pass_peers_parity": dict(
        module="fsdist.ops.sample_logits", kernel="sample_logits_kernel",
        types=dict(logits_ptr="*fp32", stride_lb="i32", tile_base="i32", tile_end="i32", cand_f="*i64", cand_i="*i64",
                   B="i32", V_rows="i32", vocab_size="i32", vocab_start="i32", buf_offset="i32", buf_offset_i="i32",
                   stride_field="i32", stride_slot="i32", hdr_off_i="i32", flags="i32", stride_ifield="i32",
                   xfp_ptr="*i64", xfp_val="i64", **ROW_PARAMS, **PARITY, **PROC),
        constexprs=dict(**PROC_CONST, BLOCK_B=32, BLOCK_V=128, TILES=2, SEED_PER_ROW=True, OFFSET_PER_ROW=True, TEMP_PER_ROW=True,
                        NOISE=True, LOGPROBS=True, PEER_TABLE=True, NPEERS=4, FAST_LOG=True,
                        DEVICE_PARITY=True, HEADER=True, EXTENDED=True, KEEP=4, XFP_PER_ROW=False,
                        WINNER_LOGIT=False, RAW_SUM=False)),
    "stage2_parity": dict(
        module="fsdist.ops.merge_candidates", kernel="merge_candidates_kernel",
        types=dict(cand_f="*fp32", cand_i="*i32", tokens_ptr="*i64", logprob_ptr="*fp32", lse_ptr="*fp32",
                   stats_ptr="*fp32", B="i32", n_slots="i32", n_local="i32", buf_offset="i32", buf_offset_i="i32",
                   stride_shard="i32", stride_shard_i="i32", stride_field="i32", stride_slot="i32", temp_ptr="*fp32",
                   temp_val="fp32", **PARITY, **CHECK, ticket_ptr="*i32"),
        constexprs=dict(BLOCK_R=2, BLOCK_S=1024, LOGPROBS=True, DEVICE_PARITY=True, TEMP_PER_ROW=True, STATS=True,
                        CHECK=True, RAW=True, END_STEP=True, NW=4, ONE_SHARD=False, PDL_WAIT=False,
                        TRIGGER=False)),
    "select_filtered": dict(
        module="fsdist.ops.select_filtered", kernel="select_filtered_kernel",
        types=dict(cand_f="*fp32", cand_i="*i32", base_f="i32", base_i="i32", B="i32", n_slots="i32", n_local="i32",
                   stride_shard="i32", stride_shard_i="i32", stride_field="i32", stride_ifield="i32",
                   stride_slot="i32", topk_ptr="*i32", topk_val="i32", topp_ptr="*fp32", topp_val="fp32",
                   minp_ptr="*fp32", minp_val="fp32", vocab_size="i32", tokens_ptr="*i64", logprob_ptr="*fp32",
                   top_ids_ptr="*i64", top_lp_ptr="*fp32", fallback_ptr="*i1", need_key_ptr="*i64",
                   scratch_f="*fp32", scratch_i="*i32", searched_ptr="*i32", small_f="*fp32", small_i="*i32",
                   drew_ptr="*i32", won_ptr="*i32", lse_ptr="*fp32", **ROW_PARAMS, **PARITY),
        constexprs=dict(SEED_PER_ROW=True, OFFSET_PER_ROW=True, TEMP_PER_ROW=True, TOPK_PER_ROW=True,
                        TOPP_PER_ROW=True, MINP_PER_ROW=False, BLOCK_R=1, BLOCK_U=8192, KEEP=4, TOP_N=5,
                        TOP_N_POW2=8, MODE=2, LOGPROBS=True, FAST_LOG=True, DEVICE_PARITY=True, PACK=True, CAP=2048,
                        SEARCHED=True, TILE_V=128, REFINE_CAP=4096, SMALL_CAP=128, DREW=True, SMALL_CHUNK=32,
                        WIDE_CAP=1024, SCRATCH_LANES=1024, WINNERS=False, WINNERS_UNCHECKED=False, WON=False,
                        MERGE=False, RAW=False, ONE_SHARD=False, SORTED=True, PDL_WAIT=False, TRIGGER=False,
                        DEAD_LATE=False, PDL_LATE=False),
        num_warps=16),  # select_filtered.SELECT_WARPS
    "entry_offsets": dict(
        module="fsdist.ops.entry_offsets", kernel="entry_offsets_kernel",
        types=dict(ent_ptr="*i32", val_ptr="*fp32", ent_stride="i32", width="i32", rounds="i32", out_ptr="*i32",
                   out_stride="i32", head_ptr="*i32", head_val_ptr="*fp32", head_stride="i32", B="i32",
                   n_tiles="i32", first_id="i32", tile="i32"), constexprs=dict(BLOCK=128, TRIGGER=False),
        ptx_lacks=["griddepcontrol"]),
    "fallback_materialize": dict(
        module="fsdist.ops.fallback", kernel="materialize_kernel",
        types=dict(h_ptr="*bf16", w_ptr="*bf16", pool_ptr="*i64", flags_ptr="*i1", B="i32",
                   round_start="i32", D="i32", V_rows="i32", vocab_size="i32", vocab_start="i32", stride_hb="i32",
                   shard_base="i32", shard_cols="i32", **PROC, cand_f="*fp32", cand_base="i32", parity_ptr="*i64",
                   parity_stride_f="i32", cand_stride_slot="i32", need_key_ptr="*i64"),
        constexprs=dict(**PROC_CONST, POOL=16, BLOCK_V=128, BLOCK_K=64, DOT_PRECISION="tf32", DOT_UPCAST=False,
                        PEER_TABLE=True, NPEERS=4, DEVICE_PARITY=True, SCAN=128, PDL_WAIT=False, TRIGGER=False)),
    "fallback_resolve": dict(
        module="fsdist.ops.fallback", kernel="resolve_kernel",
        types=dict(pool_ptr="*fp32", shard_cols="i32", flags_ptr="*i1", B="i32", round_start="i32",
                   V="i32", topk_ptr="*i32", topk_val="i32", topp_ptr="*fp32", topp_val="fp32", minp_ptr="*fp32",
                   minp_val="fp32", tokens_ptr="*i64", logprob_ptr="*fp32", top_ids_ptr="*i64", top_lp_ptr="*fp32",
                   cand_f="*fp32", cand_i="*i32", base_f="i32", base_i="i32", **PARITY, n_slots="i32", n_local="i32",
                   stride_shard="i32", stride_shard_i="i32", stride_field="i32", stride_ifield="i32",
                   stride_slot="i32", need_key_ptr="*i64", scratch_f="*fp32", scratch_i="*i32", scratch_t="*i32",
                   **ROW_PARAMS),
        constexprs=dict(SEED_PER_ROW=True, OFFSET_PER_ROW=True, TEMP_PER_ROW=True, TOPK_PER_ROW=True,
                        TOPP_PER_ROW=True, MINP_PER_ROW=True, BLOCK=4096, TOP_N=5, TOP_N_POW2=8, MODE=1,
                        LOGPROBS=True, FAST_LOG=True, POOL=16, BLOCK_R=1, KEEP=4, BLOCK_U=8192, TILE_V=128,
                        RCAP=4096, DEVICE_PARITY=True, SCAN=128, PDL_WAIT=False, TRIGGER=False), num_warps=16),
    "step_record_peers": dict(
        module="fsdist.ops.step_check", kernel="step_record_kernel",
        types=dict(dst_i="*i64", off_i="i32", batch="i32", flags="i32", error="i32", **PARITY),
        constexprs=dict(PEER_TABLE=True, NPEERS=4)),
    "end_step": dict(
        module="fsdist.ops.step_check", kernel="end_step_kernel",
        types=dict(counter_ptr="*i64", status_ptr="*i32"), constexprs=dict()),
    "prepare_processors": dict(
        module="fsdist.ops.prepare_processors", kernel="prepare_processors_kernel",
        types=dict(bias_ids_ptr="*i64", bias_ids_stride="i32", bias_val_ptr="*bf16", bias_val_stride="i32", K="i32",
                   out_ids_ptr="*i64", out_ids_stride="i32", L="i32", prompt_ids_ptr="*i64", prompt_ids_stride="i32",
                   P="i32", rep_ptr="*fp32", rep_val="fp32", freq_ptr="*fp16", freq_val="fp32", pres_ptr="*fp32",
                   pres_val="fp32", entries_ptr="*i32", values_ptr="*fp32", ent_stride="i32", pen_ptr="*fp32",
                   pen_stride="i32", bad_ptr="*i8", B="i32", vocab_size="i32", temp_ptr="*fp32", temp_val="fp32",
                   temp_out_ptr="*fp32", fp_out_ptr="*i64", bm_ptr="*i32", bm_stride="i32", W="i32",
                   xor_ptr="*i64", xor_val="i64"),
        constexprs=dict(HAS_BIAS=True, HAS_OUT=True, HAS_PROMPT=True, REP_PER_ROW=True, FREQ_PER_ROW=True,
                        PRES_PER_ROW=False, BLOCK_R=1, S_POW2=2048, SORT=True, TEMP_OUT=True, TEMP_PER_ROW=True,
                        KEY32=False, FP_OUT=False, FP_BITMASK=False, FP_XOR_ROW=False, FP_WORDS=1024),
        num_warps=8),
    "apply_entries": dict(
        module="fsdist.ops.apply_entries", kernel="apply_entries_kernel",
        types=dict(logits_ptr="*fp32", stride_l="i32", id_lo="i32", n_cols="i32", ent_ptr="*i32", val_ptr="*fp32",
                   ent_stride="i32", S="i32", B="i32", pen_ptr="*fp32", pen_stride="i32"),
        constexprs=dict(BLOCK_R=1, BLOCK_S=256, PINNED=True)),
    "sort_entries": dict(
        module="fsdist.ops.sort_entries", kernel="sort_entries_kernel",
        types=dict(ent_in="*i32", val_in="*fp32", ent_out="*i32", val_out="*fp32", stride_in="i32",
                   stride_out="i32", S="i32"),
        constexprs=dict(BLOCK_I=64, BLOCK_J=128)),
    "pad_rows": dict(  # the zero-padded hidden of partly empty TMA tiles (fused_sample.tile_operand)
        module="fsdist.ops.pad_rows", kernel="pad_rows_kernel",
        types=dict(src_ptr="*bf16", dst_ptr="*bf16", B="i32", D="i32", stride_src="i32", total="i32"),
        constexprs=dict(BLOCK=8192), num_warps=8),
    "verify_step": dict(
        module="fsdist.ops.step_check", kernel="verify_step_kernel",
        types=dict(src_i="*i32", base_i="i32", me="i32", n_writers="i32", stride_writer_i="i32", rec_slot="i32",
                   status_ptr="*i32", **PARITY),
        constexprs=dict(NW=4)),
}
# select_filtered's k-th largest and top-p over the packed lanes by pairwise counts and sums (sorted_top_p=False),
# with the min-p draw's wide lanes off (wide_cap=0: its branch must not compile with 0 lanes). Two knobs off their
# defaults in one case (each compile of this kernel is ~20-30 s of a CI core); each alone is a launcher option.
CASES["select_filtered_pairwise_wide_off"] = dict(
    CASES["select_filtered"], constexprs=dict(CASES["select_filtered"]["constexprs"], SORTED=False, WIDE_CAP=0,
                                              SCRATCH_LANES=128))
# select_filtered's other branch alone: the search over all kept logits (no packing, no instrumentation).
CASES["select_filtered_full_search"] = dict(
    CASES["select_filtered"], constexprs=dict(CASES["select_filtered"]["constexprs"], PACK=False, CAP=1, SEARCHED=False))
# The preparation's sort on 32-bit keys (the default where they fit), on 16 warps (bench/prepare_probe.py's candidate).
CASES["prepare_processors_key32"] = dict(
    CASES["prepare_processors"], constexprs=dict(CASES["prepare_processors"]["constexprs"], S_POW2=1024, KEY32=True),
    num_warps=16)
# ... writing the processors' fingerprint (the tensor-parallel header's), with a bitmask and a per-row xor (v73)
CASES["prepare_processors_fingerprint"] = dict(
    CASES["prepare_processors_key32"], constexprs=dict(CASES["prepare_processors_key32"]["constexprs"], FP_OUT=True,
                                                       FP_BITMASK=True, FP_XOR_ROW=True))
# The processors' fingerprint kernel, every part present (its fold is shared with the preparation kernel's)
CASES["processor_fingerprint"] = dict(
    module="fsdist.ops.step_check", kernel="processor_fingerprint_kernel",
    types=dict(out_ptr="*i64", bad_ptr="*i1", bm_ptr="*i32", bm_stride_r="i32", bm_stride_c="i32", W="i32",
               ent_ptr="*i32", ent_stride_r="i32", ent_stride_c="i32", val_ptr="*fp32", val_stride_r="i32",
               val_stride_c="i32", S="i32", pen_ptr="*fp32", pen_stride="i32", xor_ptr="*i64", xor_val="i64"),
    constexprs=dict(BAD=True, BITMASK=True, ENTRIES=True, PENALTIES=True, XOR_ROW=True, BLOCK=1024))
# Programmatic dependent launch (v73): entry_offsets lets the fused kernel start, which waits before its epilogue
CASES["entry_offsets_trigger"] = dict(
    CASES["entry_offsets"], constexprs=dict(CASES["entry_offsets"]["constexprs"], TRIGGER=True),
    ptx_has=["griddepcontrol.launch_dependents"], ptx_lacks=[])
CASES["stage1_fused_pdl"] = dict(
    CASES["stage1_fused_tma"], constexprs=dict(CASES["stage1_fused_tma"]["constexprs"], PDL_WAIT=True),
    ptx_has=["griddepcontrol.wait"])
# select_filtered with the min-p proof from the tiles' winners ("scaled" logprobs: "processed" turns it off),
# instrumented.
CASES["select_filtered_winners"] = dict(
    CASES["select_filtered"], constexprs=dict(CASES["select_filtered"]["constexprs"], MODE=0, MINP_PER_ROW=True,
                                              WINNERS=True, WON=True))

# ... with the merge folded in (fsdist.sample's filtered calls: no merge launch), "raw" logprobs, no instrumentation.
CASES["select_filtered_merge"] = dict(
    CASES["select_filtered"], constexprs=dict(CASES["select_filtered"]["constexprs"], MODE=1, MERGE=True, RAW=True, ONE_SHARD=True,
                                              PACK=False, CAP=1, SEARCHED=False, DREW=False))

# ... and with the min-p proof from the winners (fsdist.sample's min-p calls; Triton 3.6 once failed to compile it).
CASES["select_filtered_merge_winners"] = dict(
    CASES["select_filtered_merge"], constexprs=dict(CASES["select_filtered_merge"]["constexprs"], MODE=0, RAW=False,
                                                    MINP_PER_ROW=True, WINNERS=True, TOP_N=0, TOP_N_POW2=1,
                                                    LOGPROBS=False, TOPK_PER_ROW=False, TOPP_PER_ROW=False))

# ... over a small vocabulary (V = 1024: 32 kept logits a row, floored to 512 lanes by the launcher with the merge
# folded in; 32 lanes failed to compile on 16 warps), min-p calls without logprobs, the winners off.
CASES["select_filtered_merge_small"] = dict(
    CASES["select_filtered_merge"], constexprs=dict(CASES["select_filtered_merge"]["constexprs"], BLOCK_U=512, MODE=0,
                                                    RAW=False, LOGPROBS=False, TOP_N=0, TOP_N_POW2=1,
                                                    TOPK_PER_ROW=False, TOPP_PER_ROW=False, DEVICE_PARITY=False))

# A small vocabulary on a GPU (V = 1,024: 32 kept logits a row): no folded merge there (merge_folds), but the grouped
# pack's reshapes over [1, 32] lanes on 16 warps (Triton 3.6 failed the fold's layouts at this size).
CASES["select_filtered_small"] = dict(
    CASES["select_filtered"], constexprs=dict(CASES["select_filtered"]["constexprs"], BLOCK_U=32, PACK=False, CAP=1,
                                              SEARCHED=False, MODE=0, MINP_PER_ROW=True, WINNERS=True, TOP_N=0,
                                              TOP_N_POW2=1, LOGPROBS=False, DEVICE_PARITY=False, ONE_SHARD=True))

# The single-GPU merge (plain calls): one shard, so no division by n_local in its slot addresses.
CASES["stage2_one_shard"] = dict(
    CASES["stage2_parity"], constexprs=dict(CASES["stage2_parity"]["constexprs"], DEVICE_PARITY=False, STATS=False,
                                            CHECK=False, END_STEP=False, ONE_SHARD=True))

# The shipped single-GPU variants again with the GPU launch's alignment specialisation, as an sm_90 GPU launches
# them: programmatic dependents of stage 1 that wait before any memory access, select_filtered letting the
# fallback's first launch start (configs.pdl_stage2 / pdl_fallback, v74).
# select_filtered_merge as shipped (PDL_FALLBACK on, PDL_STAGE2 off), select_filtered_small and the merge as
# PDL_STAGE2 launches them.
_PDL = {"select_filtered_merge": dict(PDL_WAIT=False, TRIGGER=True), "select_filtered_small": dict(PDL_WAIT=True,
        TRIGGER=True), "stage2_one_shard": dict(PDL_WAIT=True, TRIGGER=False)}
for _name, _flags in _PDL.items():
    CASES[f"{_name}_div16"] = dict(
        CASES[_name], divisible=True, constexprs=dict(CASES[_name]["constexprs"], **_flags),
        ptx_has=(["griddepcontrol.wait"] if _flags["PDL_WAIT"] else [])
        + (["griddepcontrol.launch_dependents"] if _flags["TRIGGER"] else []),
        ptx_lacks=[] if _flags["PDL_WAIT"] else ["griddepcontrol.wait"], wait_first=_flags["PDL_WAIT"])
# The fallback's single-GPU launches in a PDL chain (v74): each waits first and lets the next one launch.
for _name in ("fallback_materialize", "fallback_resolve"):
    CASES[f"{_name}_pdl"] = dict(CASES[_name], divisible=True, constexprs=dict(
        CASES[_name]["constexprs"], DEVICE_PARITY=False, PDL_WAIT=True, TRIGGER=True,
        **(dict(PEER_TABLE=False, NPEERS=1) if _name == "fallback_materialize" else {})),
        types=dict(CASES[_name]["types"], **({"pool_ptr": "*fp32"} if _name == "fallback_materialize" else {})),
        ptx_has=["griddepcontrol.wait", "griddepcontrol.launch_dependents"], wait_first=True)
# select_filtered beside the merge (v76, configs.pdl_select_beside_merge), as fsdist.sample's filtered calls launch
# it: the merge lets it launch at once; it reads stage 1's candidates first and waits for the merge only before its
# first store (so no wait_first check: loads before the wait are the point), and lets the fallback launch.
CASES["select_filtered_beside_div16"] = dict(
    CASES["select_filtered"], divisible=True, constexprs=dict(
        CASES["select_filtered"]["constexprs"], MODE=0, ONE_SHARD=True, PACK=False, CAP=1, SEARCHED=False, DREW=False,
        MINP_PER_ROW=True, WINNERS=True, TOP_N=0, TOP_N_POW2=1, DEVICE_PARITY=False, TRIGGER=True, DEAD_LATE=True,
        PDL_LATE=True, SEED_PER_ROW=False, OFFSET_PER_ROW=False),
    ptx_has=["griddepcontrol.wait", "griddepcontrol.launch_dependents"], late_wait=True)
# ... over a small vocabulary (V = 1,024: 32 kept logits a row, where Triton 3.6 once failed select_filtered's
# layouts on 16 warps): fsdist.sample's filtered calls there run beside the merge too.
CASES["select_filtered_small_beside_div16"] = dict(
    CASES["select_filtered_small"], divisible=True, constexprs=dict(
        CASES["select_filtered_small"]["constexprs"], TRIGGER=True, DEAD_LATE=True, PDL_LATE=True, LOGPROBS=True),
    ptx_has=["griddepcontrol.wait", "griddepcontrol.launch_dependents"])
CASES["stage2_one_shard_trigger_div16"] = dict(
    CASES["stage2_one_shard"], divisible=True, constexprs=dict(CASES["stage2_one_shard"]["constexprs"], TRIGGER=True),
    ptx_has=["griddepcontrol.launch_dependents"], ptx_lacks=["griddepcontrol.wait"])
# Stage 1's Triton kernel letting stage 2 launch (v74, PDL_STAGE2), also as v73's dependent of the entry offsets.
CASES["stage1_fused_trigger"] = dict(
    CASES["stage1_fused_tma"], constexprs=dict(CASES["stage1_fused_tma"]["constexprs"], TRIGGER=True, PDL_WAIT=True),
    ptx_has=["griddepcontrol.launch_dependents", "griddepcontrol.wait"], ptx_lacks=[])


# The warp-specialised Hopper kernel (Gluon), extended 64-row tile: the hidden in one box of the tile's rows, and a
# one-tile batch of 24 rows in three boxes of 8 rows (launch_fused_ws's box_rows): four TMA copies a stage instead of
# two, the stage's barrier expecting 3 x 1 KB of the hidden + 16 KB of the weight, and the proxy fence that orders the
# zeroed rows' stores before the copy engine's writes.
WS_TYPES = dict(h_desc="tensordesc<bf16[64, 64],NVMMA>", hl_desc="tensordesc<bf16[64, 64],NVMMA>",
                w_desc="tensordesc<bf16[128, 64],NVMMA>", cand_f="*fp32",
                cand_i="*i32", B="i32", V_rows="i32", vocab_size="i32", vocab_start="i32", buf_offset="i32",
                buf_offset_i="i32", stride_slot="i32", n_btiles="i32", n_tiles="i32", k_steps="i32",
                stride_field="i32", stride_ifield="i32", hdr_off_i="i32", flags="i32", xfp_ptr="*i64", xfp_val="i64",
                wait_ptr="*i64", topk_ptr="*i32", topk_val="i32", topp_ptr="*fp32", topp_val="fp32", **ROW_PARAMS,
                **PARITY, **PROC)
WS_CONST = dict(STAGES=5, EPI_WARPS=8, EPI_REGS=160, LOAD_REGS=24, SEED_PER_ROW=True, OFFSET_PER_ROW=True,
                TEMP_PER_ROW=True, NOISE=True, FAST_LOG=True, ROW_THREADS=8, LOGPROBS=True, EXTENDED=True,
                WINNER_LOGIT=False, RAW_SUM=False, BITMASK=False, SPARSE=False, PINNED=True, PEER_TABLE=False,
                NPEERS=1, DEVICE_PARITY=False, HEADER=False, XFP_PER_ROW=False, BLOCK_B=64, H_BOXES=1,
                LAST_BOXES=0, ROTATE=False, NOISE_PROBE=0, ACC_BUFS=1, EPI_CHUNK=0, WAITS=False, SKIP_NOISE=False,
                TOPK_PER_ROW=False, TOPP_PER_ROW=False)
CASES["stage1_ws_extended"] = dict(module="fsdist.ops.fused_sample_ws", kernel="fused_sample_ws_kernel", gluon=True,
                                   maxnreg=128, types=WS_TYPES, constexprs=WS_CONST, ptx_lacks=["fence.proxy.async"],
                                   ptx_count={"cp.async.bulk.tensor": 2, "expect_tx.shared.b64 _, [%r": 1,
                                              ", 24576;": 1})
CASES["stage1_ws_boxes"] = dict(CASES["stage1_ws_extended"],
                                types=dict(WS_TYPES, h_desc="tensordesc<bf16[8, 64],NVMMA>"),
                                constexprs=dict(WS_CONST, H_BOXES=3),
                                ptx_has=["fence.proxy.async"], ptx_lacks=[],
                                ptx_count={"cp.async.bulk.tensor": 4, "expect_tx.shared.b64 _, [%r": 1,
                                           ", 19456;": 1})

# The plain 128-row tile (B > 64: no logprobs, no kept logits), and a batch whose last tile holds 20 rows
# (launch_fused_ws's last_box_rows): that tile's stages load three boxes of 8 rows (3 x 1 KB + 16 KB expected) beside
# the whole tiles' one box of 128 rows (32 KB; each with its weight copy), and its main loop runs one 64-row
# wgmma a k-step; its batch tiles rotate by round (fused_sample_ws.persistent_grid).
WS_PLAIN = dict(WS_CONST, LOGPROBS=False, EXTENDED=False, PINNED=False, BLOCK_B=128)
WS_PLAIN_TYPES = dict(WS_TYPES, h_desc="tensordesc<bf16[128, 64],NVMMA>", hl_desc="tensordesc<bf16[128, 64],NVMMA>")
CASES["stage1_ws_plain"] = dict(CASES["stage1_ws_extended"], types=WS_PLAIN_TYPES, constexprs=WS_PLAIN,
                                ptx_count={"cp.async.bulk.tensor": 2, "expect_tx.shared.b64 _, [%r": 1,
                                           ", 32768;": 1}, ptx_lacks=["fence.proxy.async", "nounroll"])
CASES["stage1_ws_last_boxes"] = dict(CASES["stage1_ws_plain"],
                                     types=dict(WS_PLAIN_TYPES, hl_desc="tensordesc<bf16[8, 64],NVMMA>"),
                                     constexprs=dict(WS_PLAIN, LAST_BOXES=3, ROTATE=True),
                                     ptx_count={"cp.async.bulk.tensor": 6, "expect_tx.shared.b64 _, [%r": 2,
                                                ", 32768;": 1, ", 19456;": 1})

# The 128-row tile with kept logits and the winners' logits (configs.WS_FIELDS_FULL_TILE: each column half's fields
# taken as it arrives, before its noise is drawn)
CASES["stage1_ws_extended_128"] = dict(CASES["stage1_ws_plain"], constexprs=dict(WS_CONST, BLOCK_B=128,
                                                                                 WINNER_LOGIT=True))

# A filtered call's tiles drawing the noise only where a row reads it (configs.SKIP_FILTERED_NOISE, v123): the Triton
# kernel's extended tile and both ws tiles, per-row top-k / top-p (the 64-row tile then draws its bits late).
CASES["stage1_fused_skip_noise"] = dict(
    CASES["stage1_fused_tma"], constexprs=dict(CASES["stage1_fused_tma"]["constexprs"], SKIP_NOISE=True,
                                               TOPK_PER_ROW=True, TOPP_PER_ROW=True))
CASES["stage1_ws_extended_skip_noise"] = dict(CASES["stage1_ws_extended"], constexprs=dict(
    WS_CONST, SKIP_NOISE=True, TOPK_PER_ROW=True, TOPP_PER_ROW=True))
CASES["stage1_ws_extended_128_skip_noise"] = dict(CASES["stage1_ws_extended_128"], constexprs=dict(
    CASES["stage1_ws_extended_128"]["constexprs"], SKIP_NOISE=True, TOPK_PER_ROW=True, TOPP_PER_ROW=True))

# The hand-off variants of plain calls (v87 / v90): a buffer per column half, and the chunked epilogue (each half in
# chunks of 16 columns walked in a loop that ptxas must not unroll: the pragma reaches the PTX), on a short last tile.
CASES["stage1_ws_chunked"] = dict(CASES["stage1_ws_last_boxes"],
                                  constexprs=dict(WS_PLAIN, LAST_BOXES=3, ROTATE=True, ACC_BUFS=2, EPI_CHUNK=16),
                                  ptx_has=['.pragma "nounroll"'], ptx_lacks=[])

# The shipped main loop keeps one wgmma group in flight while it awaits the next stage (v104: retiring each one
# before the next stage is awaited cost 12-31%).
CASES["stage1_ws_plain"]["ptx_has"] = CASES["stage1_ws_plain"].get("ptx_has", []) + [
    "wgmma.wait_group.sync.aligned 1;"]

# The noise's PTX (noise.py, v97): every kernel that draws the sampler's noise on CUDA takes each Philox product
# as one mul.wide.u32 (not tl.philox's mul.hi + mul.lo pairs) and each log as lg2.approx.ftz (no subnormal fix-up
# around it); the same bits as before, fewer instructions per id. (A checked layout's header hashes its fingerprint
# with one tl.philox word a row, off the per-id path: step_check.py; its mul.hi pairs stay.)
NOISE_PTX = dict(has=["lg2.approx.ftz.f32", "mul.wide.u32"], lacks=["lg2.approx.f32", "mul.hi.u32"])
NOISE_CASES = ["stage1_fused_peers_parity", "stage1_fused_tma", "stage1_pass_peers_parity", "select_filtered",
               "stage1_fused_skip_noise", "stage1_ws_extended_skip_noise", "stage1_ws_extended_128_skip_noise",
               "fallback_resolve", "stage1_ws_extended", "stage1_ws_plain", "stage1_ws_chunked"]
for _name in NOISE_CASES:
    _lacks = [t for t in NOISE_PTX["lacks"] if t != "mul.hi.u32" or not CASES[_name]["constexprs"].get("HEADER")]
    CASES[_name] = dict(CASES[_name], ptx_has=CASES[_name].get("ptx_has", []) + NOISE_PTX["has"],
                        ptx_lacks=CASES[_name].get("ptx_lacks", []) + _lacks)

# The wait probe (launch_fused_ws(wait_probe=), benchmarks): cycle counts around the MMA warpgroup's, the load warp's
# and the epilogue's waits, on a short last tile; the plain launch reads no clock. 34 reads: each partition's start and
# end (6); the MMA tile's two copies (whole, short) 2 x (operands 2, wgmma retire 2 + 2, hand-off 2 x 2); the load
# tile's two copies 2 x 2; the epilogue's two halves 2 x 2. The chunked epilogue's path too.
CASES["stage1_ws_waits"] = dict(CASES["stage1_ws_last_boxes"], constexprs=dict(WS_PLAIN, LAST_BOXES=3, WAITS=True),
                                ptx_count=dict(CASES["stage1_ws_last_boxes"]["ptx_count"], **{"%clock64": 34}))
CASES["stage1_ws_waits_chunked"] = dict(CASES["stage1_ws_waits"], ptx_lacks=[], constexprs=dict(
    WS_PLAIN, LAST_BOXES=3, WAITS=True, EPI_CHUNK=16, ACC_BUFS=2))
CASES["stage1_ws_plain"]["ptx_lacks"] = CASES["stage1_ws_plain"]["ptx_lacks"] + ["%clock64"]

# The ping-pong kernel (fused_sample_pp.py, v111b): two consumer warpgroups at 240 registers each (setmaxnreg), the
# wgmma loop keeping one group in flight, each consumer's epilogue through shared memory into the ws epilogue's quad
# layout (no lane shuffles), the noise's v97 instructions.
PP_TYPES = dict(h_desc="tensordesc<bf16[128, 64],NVMMA>", w_desc="tensordesc<bf16[128, 64],NVMMA>", cand_f="*fp32",
                cand_i="*i32", B="i32", V_rows="i32", vocab_size="i32", vocab_start="i32", buf_offset="i32",
                buf_offset_i="i32", stride_slot="i32", n_btiles="i32", n_tiles="i32", k_steps="i32", wait_ptr="*i64",
                **ROW_PARAMS)
PP_CONST = dict(STAGES=5, CONSUMER_REGS=240, LOAD_REGS=24, SEED_PER_ROW=True, OFFSET_PER_ROW=True,
                TEMP_PER_ROW=True, NOISE=True, FAST_LOG=True, PEER_TABLE=False, NPEERS=1, SHARED_EPILOGUE=8,
                WAITS=False)
CASES["stage1_pp"] = dict(module="fsdist.ops.fused_sample_pp", kernel="fused_sample_pp_kernel", gluon=True,
                          maxnreg=168, types=PP_TYPES, constexprs=PP_CONST,
                          ptx_has=["wgmma.wait_group.sync.aligned 1;", "setmaxnreg.inc.sync.aligned.u32 \t240;"]
                          + NOISE_PTX["has"], ptx_lacks=NOISE_PTX["lacks"] + ["0x1f, 0xffffffff;"],
                          ptx_count={"cp.async.bulk.tensor": 2})
CASES["stage1_pp_sh4"] = dict(CASES["stage1_pp"], constexprs=dict(PP_CONST, SHARED_EPILOGUE=4))
# v116: the wait probe's clock reads (launch_fused_pp(wait_probe=); 16: in each consumer's copy its start and end,
# a turn and an operand wait's two each, the tail's two)
CASES["stage1_pp_waits"] = dict(CASES["stage1_pp"], constexprs=dict(PP_CONST, WAITS=True),
                                ptx_count=dict(CASES["stage1_pp"]["ptx_count"], **{"%clock64": 16}))
CASES["stage1_pp_greedy"] = dict(CASES["stage1_pp"], constexprs=dict(PP_CONST, NOISE=False, SEED_PER_ROW=False),
                                 ptx_has=["wgmma.wait_group.sync.aligned 1;"], ptx_lacks=["0x1f, 0xffffffff;"],
                                 ptx_count={"cp.async.bulk.tensor": 2})

for _case in ("stage1_pp", "stage1_pp_sh4", "stage1_pp_greedy"):
    CASES[_case]["ptx_lacks"] = CASES[_case].get("ptx_lacks", []) + ["%clock64"]  # (the wait probe off: no reads)

# The checks' power: specs a check must refuse, each with the message it must give.
FAILING = {
    # the noise's checks refuse the instructions before v97 (launch_fused_ws(noise_probe="legacy"): the same bits)
    "noise_ptx_legacy": (dict(CASES["stage1_ws_plain"], constexprs=dict(WS_PLAIN, NOISE_PROBE=4)),
                         "PTX check failed: missing ['lg2.approx.ftz.f32', 'mul.wide.u32'], unexpected "
                         "['lg2.approx.f32', 'mul.hi.u32']"),
    # late_wait fails on each thing it looks for: a 64-bit global load before the wait (the beside case with the
    # per-row int64 seed, which finish_rows loads before its wait), and no load before the wait (select_filtered
    # waiting at its first instruction, PDL_STAGE2's way)
    "late_wait_seed_per_row": (dict(CASES["select_filtered_beside_div16"], constexprs=dict(
        CASES["select_filtered_beside_div16"]["constexprs"], SEED_PER_ROW=True)), "64-bit global load"),
    "late_wait_waits_first": (dict(CASES["select_filtered_beside_div16"], constexprs=dict(
        CASES["select_filtered_beside_div16"]["constexprs"], DEAD_LATE=False, PDL_LATE=False, PDL_WAIT=True)),
        "no global load before"),
    # wait_first fails where loads do come before griddepcontrol.wait: v73's fused kernel, whose main loop reads
    # the hidden and the weight before it waits for the entry offsets
    "wait_first_v73": (dict(CASES["stage1_fused_pdl"], wait_first=True), "precedes griddepcontrol.wait"),
    # ptx_count fails when the kernel has another number of the instruction: the boxed kernel held to the one-box
    # kernel's two TMA copies a stage and 24 KB expected
    "ptx_count_boxes": (dict(CASES["stage1_ws_boxes"], ptx_count=CASES["stage1_ws_extended"]["ptx_count"]),
                        "PTX check failed: counts"),
}
LOWER_TIMEOUT_S = 1200  # every case in one process: ~310 s for ~60 cases on an idle core (select_filtered's ~150)


@pytest.fixture(scope="module")
def lowering_available():
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the other suites compile and run the real kernels")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except Exception as e:  # pragma: no cover - triton without the NVIDIA backend
        pytest.skip(f"Triton's NVIDIA backend is unavailable: {e}")


def _lower_batch(specs, timeout):
    """One process over ``specs``: ({name: (ok, message)} it reported, the case it started and never reported or None,
    its exit status, its stderr, whether it ran out of time). Its own session, so that a timeout kills the compiler
    processes it started too (ptxas inherits its pipes: they would keep communicate() waiting)."""
    proc = subprocess.Popen([sys.executable, "-c", _LOWER], env=dict(os.environ, TRITON_INTERPRET="0"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(json.dumps(specs), timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    got, started = {}, None
    for line in out.splitlines():
        if line.startswith("START "):
            started = line[len("START "):]
        elif line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            got[r["case"]] = (r["ok"], r["msg"])
    return got, (started if started not in got else None), proc.returncode, err, timed_out


def lower_all(specs, timeout=LOWER_TIMEOUT_S):
    """{name: (ok, message)} for every spec, lowered with the interpreter off in one subprocess (the imports once, not
    once per case). A case that kills the process (a compiler abort, a segfault) fails with that and the process's
    stderr, and the cases after it run in a fresh process; past ``timeout`` seconds in all, the running case fails as
    timed out and the rest as not run. A process that exits with an error after reporting every case fails them."""
    results, pending = {}, dict(specs)
    deadline = time.monotonic() + timeout
    while pending:
        got, culprit, rc, err, timed_out = _lower_batch(pending, max(1.0, deadline - time.monotonic()))
        results.update(got)
        for name in got:
            pending.pop(name)
        if culprit is None and not pending:
            if rc != 0:  # every case reported, then the process failed (e.g. at exit)
                results.update({n: (False, f"the lowering process exited with {rc} after its cases; stderr: "
                                           f"{err[-3000:]}") for n in got})
            break
        why = f"ran past {timeout} s" if timed_out else f"exited with {rc}"
        if culprit is not None:
            results[culprit] = (False, f"the lowering process {why} while lowering this case; stderr: {err[-3000:]}")
            pending.pop(culprit)
        if timed_out or culprit is None:  # (no case to blame: nothing would change on a retry)
            results.update({n: (False, f"not lowered: the lowering process {why} before this case; stderr: "
                                       f"{err[-3000:]}") for n in pending})
            break
    return results


@pytest.fixture(scope="module")
def lowered(lowering_available):
    return lower_all(dict(CASES, **{name: spec for name, (spec, _) in FAILING.items()}))


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_lowers_to_triton_ir(lowered, case):
    ok, msg = lowered[case]
    assert ok and msg.startswith("COMPILED"), msg


@pytest.mark.parametrize("case", list(FAILING))
def test_each_ptx_check_can_fail(lowered, case):
    """The PTX checks above are not vacuous: each refuses a kernel that breaks what it looks for."""
    ok, msg = lowered[case]
    assert not ok and FAILING[case][1] in msg, msg


def test_a_failing_case_does_not_hide_the_others(lowering_available, tmp_path, monkeypatch):
    """The batch reports each case on its own: a kernel that does not exist fails alone, and so does a case that kills
    the process (a module that exits at import, as a compiler abort would), its neighbours compile all the same."""
    (tmp_path / "exits_at_import.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    good = CASES["pad_rows"]
    got = lower_all({"before": good, "missing": dict(good, kernel="no_such_kernel"),
                     "crash": dict(good, module="exits_at_import"), "after": good})
    assert got["before"][0] and got["after"][0], got
    assert not got["missing"][0] and "no_such_kernel" in got["missing"][1], got
    assert not got["crash"][0] and "exited with 3 while lowering this case" in got["crash"][1], got


def test_a_hanging_case_fails_in_time(lowering_available, tmp_path, monkeypatch):
    """A case that never ends fails as timed out once the batch's time is spent (the process group killed), and the
    cases after it as not run: a hang cannot stall the suite."""
    (tmp_path / "hangs_at_import.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    good = CASES["pad_rows"]
    t0 = time.monotonic()
    got = lower_all({"hang": dict(good, module="hangs_at_import"), "after": good}, timeout=10)
    assert time.monotonic() - t0 < 60
    assert not got["hang"][0] and "ran past 10 s while lowering this case" in got["hang"][1], got
    assert not got["after"][0] and "not lowered" in got["after"][1], got
