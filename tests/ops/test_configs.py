"""Tile-config helpers that need no kernel: the shared-memory fit of the pipeline depth."""
import dataclasses
import types

import pytest
import torch

from fsdist.ops import configs
from fsdist.ops.configs import TileConfig, fit_num_stages

CUDA0 = types.SimpleNamespace(type="cuda", index=0)


@pytest.fixture
def hopper_smem(monkeypatch):
    """Pretend the current device opts blocks into Hopper's 227 KB of shared memory."""
    monkeypatch.setattr(configs, "_smem_per_block", lambda index: 227 << 10)


def test_two_byte_operands_keep_their_tuned_depth(hopper_smem):
    # 16x128x128 bf16: 36 KB a stage, 5 stages fit in 227 KB beside the epilogue's reserve.
    cfg = TileConfig(16, 128, 128, num_warps=4, num_stages=5)
    assert fit_num_stages(cfg, 2, CUDA0) == 5


def test_fp32_operands_get_fewer_stages(hopper_smem):
    # The same tile in fp32 needs 72 KB a stage: 5 stages (288 KB) cannot launch; what fits is
    # 1 + (227 - 16) // 72 = 3.
    cfg = TileConfig(16, 128, 128, num_warps=4, num_stages=5)
    stages = fit_num_stages(cfg, 4, CUDA0)
    assert stages == 3
    per_stage = (cfg.block_b + cfg.block_v) * cfg.block_k * 4
    assert (stages - 1) * per_stage <= (227 - 16) << 10


def test_never_below_two_and_cpu_untouched(hopper_smem):
    big = TileConfig(128, 256, 128, num_warps=8, num_stages=4)   # 192 KB a stage in fp32
    assert fit_num_stages(big, 4, CUDA0) == 2
    cpu = types.SimpleNamespace(type="cpu", index=None)
    assert fit_num_stages(big, 4, cpu) == big.num_stages


@pytest.mark.parametrize("batch, path, path_8192", [
    (1, "fused", "fused"), (64, "fused", "fused"), (65, "fused", "fused"), (95, "fused", "fused"),
    (96, "fused", "fused"), (128, "fused", "fused"), (129, "fused", "chunked"), (192, "fused", "chunked"),
    (223, "fused", "chunked"), (224, "fused", "fused"), (239, "fused", "fused"), (256, "fused", "fused"),
    (257, "chunked", "chunked"), (320, "chunked", "chunked"), (351, "chunked", "chunked"), (352, "fused", "fused"),
    (384, "fused", "fused"), (479, "chunked", "chunked"), (480, "fused", "fused"), (512, "fused", "fused"),
    (513, "chunked", "chunked"), (1024, "fused", "fused")])
def test_large_batches_of_whole_tiles_go_back_to_the_fused_kernel(batch, path, path_8192):
    """Every batch of one 128-row tile is fused (v38); past it the fused kernel takes batches whose last tile holds
    >= 96 rows and, with a hidden of <= 4096 (a padded tile's wasted MMA work is small there), every batch of two
    tiles (v36)."""
    assert configs.choose_path(batch, 4096, "cuda") == path
    assert configs.choose_path(batch, 2048, "cuda") == path
    assert configs.choose_path(batch, 8192, "cuda") == path_8192
    assert configs.choose_path(batch, 4096, "cpu") == "fused"  # the interpreter has no cuBLAS path
    # fp32 operands: the fused kernel's fp32 dot is FMA math, so past B = 64 cuBLAS computes the logits
    assert configs.choose_path(batch, 4096, "cuda", elem_size=4) == ("fused" if batch <= 64 else "chunked")


@pytest.mark.parametrize("batch, path", [
    (65, "fused"), (128, "fused"), (129, "chunked"), (192, "chunked"), (224, "chunked"), (239, "chunked"),
    (240, "fused"), (256, "fused"), (320, "chunked"), (360, "chunked"), (383, "fused"), (496, "fused")])
def test_faster_memory_fuses_only_well_filled_last_tiles(batch, path):
    """On a GPU with faster memory (the H200: FAST_MEMORY_GBPS) the chunked path's GEMM is cheaper, so past one tile
    only a last tile of >= 112 rows is fused, at every hidden size (v39)."""
    for d in (2048, 4096, 8192):
        assert configs.choose_path(batch, d, "cuda", fast_memory=True) == path


def test_fast_memory_is_read_off_the_driver(monkeypatch):
    real = configs.dram_gbps
    assert configs.fast_memory(torch.device("cpu")) is False
    monkeypatch.setattr(configs, "dram_gbps", lambda index: 4800.0)  # an H200's
    assert configs.fast_memory(torch.device("cuda", 0)) is True
    monkeypatch.setattr(configs, "dram_gbps", lambda index: 3350.0)  # an H100 SXM's
    assert configs.fast_memory(torch.device("cuda", 0)) is False
    monkeypatch.setattr(configs, "dram_gbps", lambda index: 0.0)  # a driver that does not say
    assert configs.fast_memory(torch.device("cuda", 0)) is False
    assert configs.fast_memory("cpu") is False  # strings are devices too
    if not torch.cuda.is_available():
        assert real.__wrapped__(0) == 0.0  # no driver to ask: not fast, and no error


def test_large_batch_config_is_tma_fed_128_row_tiles():
    cfg = configs.pick_config(512, 4096, "cuda")
    assert (cfg.block_b, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.tma) == (128, 64, 8, 5, True)
    assert configs.pick_config(64, 4096, "cuda").block_b == 64


@pytest.mark.parametrize("hidden", [4096, 8192])
def test_the_ws_128_row_tile_takes_one_stage_fewer_from_1024_rows_without_fast_memory(hidden):
    """v91 / v92 (H100): from WS_FEWER_STAGES_FROM rows the warp-specialised 128-row tile runs 4 operand stages (8-15%
    faster with noise at B = 1024) where that kernel runs (ws_kernel) and memory is not fast; below, on fast memory
    (the H200: not measured) and where only the Triton kernel runs (another GPU, fp32), 5. A user's named config keeps
    its depth for the Triton twin too. The stage count changes no candidate."""
    assert configs.WS_FEWER_STAGES_FROM == 1024 and configs.WS_LARGE_BATCH_STAGES == 4
    for batch, stages in ((512, 5), (768, 5), (1023, 5), (1024, 4), (4096, 4)):
        cfg = configs.pick_config(batch, hidden, "cuda", ws_kernel=True)
        assert (cfg.block_b, cfg.ws, cfg.num_stages) == (128, True, stages), batch
        assert configs.pick_config(batch, hidden, "cuda", ws_kernel=True, fast_memory=True).num_stages == 5
        assert configs.pick_config(batch, hidden, "cuda").num_stages == 5  # no ws kernel: the Triton tile's depth
    named = TileConfig.parse("128x128x64w8s3t-ws")
    assert configs.triton_twin(named, hidden).num_stages == 3 and not configs.triton_twin(named, hidden).ws
    # filtered calls past 64 rows keep their 64-row tile and its stages
    assert configs.pick_config(1024, 4096, "cuda", extended=True, extended_ws=True, ws_kernel=True).num_stages == 5


def test_register_cap_is_validated_and_named():
    cfg = TileConfig.parse("128x128x64w8s3tr128")
    assert cfg.max_regs == 128 and cfg.tma and cfg.name == "128x128x64w8s3tr128"
    with pytest.raises(ValueError, match="max_regs"):
        TileConfig(128, 128, 64, max_regs=7)


def test_stagger_is_validated_and_named():
    cfg = TileConfig.parse("16x128x128w4s5d20")
    assert cfg.stagger_us == 20 and cfg.name == "16x128x128w4s5d20" and TileConfig.parse(cfg.name) == cfg
    assert TileConfig.parse("128x128x64w8s3tr128d7-ws").name == "128x128x64w8s3tr128d7-ws"
    assert TileConfig(16, 128, 128).name == "16x128x128w4s4"  # no delay: no suffix
    assert TileConfig.parse("16x128x128w4s5").stagger_us == 0  # names written before the field read back unstaggered
    for bad in (-1, 1001, 2.5, True):
        with pytest.raises(ValueError, match="stagger_us"):
            TileConfig(16, 128, 128, stagger_us=bad)


def test_one_tile_triton_configs_stagger_their_first_wave():
    # B <= 16 on a GPU: one batch tile on the Triton kernel, the first wave staggered by 3 µs per 1,024 of D up to 12,
    # plain or extended alike
    for B in (1, 16):
        for ext in (False, True):
            assert configs.pick_config(B, 4096, "cuda", extended=ext).stagger_us == 12
            assert configs.pick_config(B, 8192, "cuda", extended=ext).stagger_us == configs.STAGGER_MAX_US == 12
            assert configs.pick_config(B, 2048, "cuda", extended=ext).stagger_us == 6
            assert configs.pick_config(B, 64, "cuda", extended=ext).stagger_us == 1
    assert configs.pick_config(16, 4096, "cuda").name == "16x128x128w4s5d12"
    # B = 17-32, the 32-row tile (v61 / v62): plain calls 1.5 µs per 1,024 up to 12, extended ones 4 up to 16
    for B in (17, 32):
        for d, plain, ext in ((64, 1, 1), (2048, 3, 8), (4096, 6, 16), (8192, 12, 16), (16384, 12, 16)):
            assert configs.pick_config(B, d, "cuda").stagger_us == plain
            assert configs.pick_config(B, d, "cuda", extended=True).stagger_us == ext
    assert configs.pick_config(32, 4096, "cuda").name == "32x128x128w4s4d6"
    assert configs.pick_config(32, 4096, "cuda", extended=True).name == "32x128x128w4s4d16"
    # the warp-specialised and 128-row tiles overlap their epilogues themselves; the interpreter has no timer
    for B in (33, 64, 128, 512):
        assert configs.pick_config(B, 4096, "cuda").stagger_us == 0
        assert configs.pick_config(B, 4096, "cuda", extended=True).stagger_us == 0
    assert configs.pick_config(16, 4096, "cpu").stagger_us == 0
    assert configs.pick_config(32, 4096, "cpu", extended=True).stagger_us == 0


def test_stagger_applies_only_to_many_waves_of_one_batch_tile_on_an_nvidia_gpu(monkeypatch):
    cfg = configs.pick_config(16, 4096, "cuda")
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # (a device object needs no GPU)
    monkeypatch.setattr(torch.version, "hip", None)
    assert configs.stagger_applies(cfg, gpu, 1, 1187, 132)  # V = 151936: 9 waves
    assert configs.stagger_applies(cfg, gpu, 1, 594, 132)  # a TP = 2 shard: 4.5 waves
    assert configs.stagger_applies(cfg, gpu, 1, 3 * 132, 132)  # STAGGER_MIN_WAVES exactly
    assert not configs.stagger_applies(cfg, gpu, 1, 3 * 132 - 1, 132)
    assert not configs.stagger_applies(cfg, gpu, 1, 149, 132)  # a TP = 8 shard, a 32k vocabulary
    assert not configs.stagger_applies(cfg, gpu, 2, 1187, 132)  # two batch tiles: the waves interleave them
    assert not configs.stagger_applies(cfg, cpu, 1, 1187, 132)  # no PTX timer off the GPU
    assert not configs.stagger_applies(dataclasses.replace(cfg, stagger_us=0), gpu, 1, 1187, 132)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not configs.stagger_applies(cfg, gpu, 1, 1187, 132)  # ROCm: no %globaltimer


def test_large_batch_config_runs_warp_specialised_where_it_can():
    cfg = configs.pick_config(512, 4096, "cuda")
    assert cfg.ws and cfg.name == "128x128x64w8s5t-ws"
    assert TileConfig.parse(cfg.name) == cfg
    small = configs.pick_config(64, 4096, "cuda")  # one 64-row tile, warp-specialised where it runs ...
    assert small.ws and small.name == "64x128x64w8s5t-ws" and configs.pick_config(33, 4096, "cuda") == small
    # ... else the Triton kernel's 64-row tile; a 128-row ws tile keeps its tile on the Triton kernel
    assert configs.triton_twin(small, 4096).name == "64x128x128w8s4"
    assert configs.triton_twin(cfg, 4096).name == "128x128x64w8s5t"
    # (cached: keyed by the config and the hidden size, the same twins as computed afresh)
    assert configs.triton_twin(small, 64).block_k == 64 and configs.triton_twin(small, 4096).block_k == 128
    for c in (small, cfg, configs.pick_config(16, 4096, "cuda")):
        for d in (64, 4096):
            assert configs.triton_twin(c, d) == configs.triton_twin.__wrapped__(c, d)
    assert not configs.pick_config(32, 4096, "cuda").ws
    with pytest.raises(ValueError, match="ws must be a bool"):
        TileConfig(128, 128, 64, ws="yes")
    # a vocabulary tile narrower than one bitmask word is refused here, not by a kernel at launch
    with pytest.raises(ValueError, match=r"block_v must be a power of two >= 32, got 16"):
        TileConfig(16, 16, 64)
    with pytest.raises(ValueError, match=r"block_b must be a power of two >= 16, got 48"):
        TileConfig(48, 128, 64)


@pytest.mark.parametrize("batch, path", [(1, "fused"), (64, "fused"), (65, "fused"), (96, "fused"), (128, "fused"),
                                         (129, "chunked"), (240, "chunked"), (256, "chunked"), (1024, "chunked")])
def test_bias_and_penalty_entries_go_chunked_past_one_128_row_tile(batch, path):
    """Calls with logit bias / penalty entries run the 64-row ws tile on the fused path past B = 64; past one
    128-row tile the chunked path was faster (SPARSE_CHUNKED_ABOVE), up to it the usual rule holds."""
    assert configs.choose_path(batch, 4096, "cuda", sparse_processors=True) == path
    assert configs.choose_path(batch, 4096, "cpu", sparse_processors=True) == "fused"


def test_the_plan_asks_the_device_for_its_memory(monkeypatch):
    """plan_sample hands choose_path the device's fast_memory: B = 192 at D = 4096 is fused on an H100-class GPU and
    chunked on an H200-class one (no GPU is touched: the answer is patched in)."""
    from fsdist.ops import plan

    kw = dict(batch=192, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0))
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: False)  # (the plan asks it of every CUDA call)
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: False)
    assert plan.plan_sample(**kw).path == "fused"
    assert plan.plan_sample(**kw, fast_memory=True).path == "chunked"  # a TP head's agreed answer wins
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    assert plan.plan_sample(**kw).path == "chunked"
    assert plan.plan_sample(**kw, fast_memory=False).path == "fused"


def test_fast_memory_deepens_only_the_32_row_tile():
    """On a GPU with faster memory the 32-row tile (B = 17-32) runs FAST_MEMORY_32_ROW_STAGES stages (v59 / v60: an
    H200 gains 1-10 µs, an H100 loses up to 7 at D = 8192, so it keeps 4); every other tile is the same either way."""
    for B in (17, 20, 32):
        for d in (2048, 4096, 8192):
            slow, fast = configs.pick_config(B, d, "cuda"), configs.pick_config(B, d, "cuda", fast_memory=True)
            assert slow.num_stages == 4 and fast.num_stages == configs.FAST_MEMORY_32_ROW_STAGES == 5
            assert dataclasses.replace(fast, num_stages=4) == slow  # nothing else moves (stagger included)
    assert configs.pick_config(32, 4096, "cuda", fast_memory=True).name == "32x128x128w4s5d6"
    assert configs.pick_config(32, 4096, "cuda", fast_memory=True, extended=True).name == "32x128x128w4s5d16"
    for B in (1, 16, 33, 64, 128, 512):
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True) == configs.pick_config(B, 4096, "cuda")
    assert configs.pick_config(32, 4096, "cpu", fast_memory=True) == configs.pick_config(32, 4096, "cpu")


def test_the_plan_picks_the_32_row_depth_from_the_memory(monkeypatch):
    """plan_sample hands pick_config the same fast_memory answer as choose_path: asked of the device when None, a
    TP head's agreed answer otherwise."""
    from fsdist.ops import plan

    kw = dict(batch=32, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0))
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: False)  # (the plan asks it of every CUDA call)
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: False)
    assert plan.plan_sample(**kw).config.num_stages == 4
    assert plan.plan_sample(**kw, fast_memory=True).config.num_stages == 5
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    assert plan.plan_sample(**kw).config.num_stages == 5
    assert plan.plan_sample(**kw, fast_memory=False).config.num_stages == 4


def test_the_plan_staggers_extended_32_row_calls_longer(monkeypatch):
    """plan_sample picks the 32-row tile's stagger by the kind of call: plain 6 µs, extended (filters) 16 at D = 4096;
    an explicit config keeps its own."""
    from fsdist.ops import plan

    monkeypatch.setattr(plan, "device_fast_memory", lambda device: False)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)  # (slow memory: the 32-row tile anyway)
    kw = dict(batch=24, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0))
    assert plan.plan_sample(**kw).config.stagger_us == 6
    assert plan.plan_sample(**kw, extended=True).config.stagger_us == 16
    mine = TileConfig.parse("32x128x128w4s4d9")
    assert plan.plan_sample(**kw, extended=True, config=mine).config is mine


def test_default_config_asks_the_device_for_its_memory(monkeypatch):
    """default_config (the benchmarks' name for the default tile) is pick_config with the device's own fast_memory
    answer and the call's kind."""
    import fsdist.ops.fused_sample_ws as fused_sample_ws

    monkeypatch.setattr(configs, "dram_gbps", lambda index: 4800.0)  # an H200's
    monkeypatch.setattr(fused_sample_ws, "ws_device", lambda device, dtype=None: False)
    cuda = torch.device("cuda", 0)
    assert configs.default_config(32, 4096, cuda) == configs.pick_config(32, 4096, "cuda", fast_memory=True)
    assert configs.default_config(32, 4096, cuda, extended=True).name == "32x128x128w4s5d16"
    monkeypatch.setattr(fused_sample_ws, "ws_device", lambda device, dtype=None: True)  # an H200 runs it
    assert configs.default_config(32, 4096, cuda, extended=True) == configs.pick_config(64, 4096, "cuda",
                                                                                        fast_memory=True)
    monkeypatch.setattr(fused_sample_ws, "ws_device", lambda device, dtype=None: False)
    monkeypatch.setattr(configs, "dram_gbps", lambda index: 3350.0)  # an H100 SXM's
    assert configs.default_config(32, 4096, cuda).name == "32x128x128w4s4d6"
    assert configs.default_config(32, 4096, "cpu") == configs.pick_config(32, 4096, "cpu")
    assert configs.default_config(16, 4096, cuda, block_v=64).block_v == 64


def test_calls_with_entries_take_the_ws_64_row_tile_from_17_rows_on_fast_memory(monkeypatch):
    """Logit bias / penalty entries at B = 17-32 run on the warp-specialised 64-row tile (its processors beside the next
    tile's wgmmas; v67) on fast-memory GPUs; B <= 16, calls without entries and other GPUs keep the Triton tiles; and
    plan_sample passes the call's kind (and the device's fast_memory) to pick_config."""
    ws64 = configs.pick_config(64, 4096, "cuda", fast_memory=True)
    assert ws64.ws and ws64.block_b == 64
    for B in (17, 24, 32):
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True, sparse_processors=True) == ws64
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True).block_b == 32
        assert configs.pick_config(B, 4096, "cuda", sparse_processors=True).block_b == 32  # not measured: kept
        assert configs.pick_config(B, 4096, "cpu", fast_memory=True, sparse_processors=True) == configs.pick_config(
            B, 4096, "cpu")
    assert configs.SPARSE_WS_MIN_BATCH == 17
    assert configs.pick_config(16, 4096, "cuda", fast_memory=True, sparse_processors=True).block_b == 16
    assert configs.pick_config(48, 4096, "cuda", fast_memory=True, sparse_processors=True) == ws64
    from fsdist.ops import plan

    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    kw = dict(batch=24, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0), path="fused")
    assert plan.plan_sample(**kw, sparse_processors=True).config == ws64
    assert plan.plan_sample(**kw).config.block_b == 32
    # where the warp-specialised kernel cannot run (not sm_90, no Gluon, fp32), such calls keep the 32-row tile
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: False)
    assert plan.plan_sample(**kw, sparse_processors=True).config.block_b == 32
    assert configs.default_config(24, 4096, "cpu", sparse_processors=True) == configs.pick_config(24, 4096, "cpu")



def test_pdl_after_entry_offsets_only_on_sm90_gpus(monkeypatch):
    """Programmatic dependent launch needs griddepcontrol (sm_90+): never on a CPU or under the interpreter, never
    on an older GPU, and off everywhere with PDL_AFTER_ENTRY_OFFSETS = False."""
    assert not configs.pdl_after_entry_offsets(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not configs.pdl_after_entry_offsets(torch.device("cuda", 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if torch.version.hip is None:
        assert configs.pdl_after_entry_offsets(torch.device("cuda", 0))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
        assert not configs.pdl_after_entry_offsets(torch.device("cuda", 0))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(configs, "PDL_AFTER_ENTRY_OFFSETS", False)
    assert not configs.pdl_after_entry_offsets(torch.device("cuda", 0))


@pytest.mark.parametrize("batches, kept", [((17, 24, 32), 32), ((65, 96, 128, 200, 256, 1024), 128)],
                         ids=["17-32", "past-64"])
def test_extended_calls_take_the_ws_64_row_tile_up_to_d4096(monkeypatch, batches, kept):
    """Filtered / top-N calls on one GPU past B = 64 run on the warp-specialised 64-row tile where D <= 4096 (v80,
    H200: 5-8% faster than the 128-row tile's Triton twin at B = 96-256, D = 4096, 3-9% slower at 8192; v85, H100:
    5-10% faster, level to 7% slower at 8192), and at B = 17-32 on fast memory only (v65 / v74, H200: 2-3 µs faster at
    D = 4096, 7-8 slower at 8192; v85, H100: 3-7 µs slower); B <= 16, D = 8192, plain calls and the tensor-parallel
    heads' checked layouts keep the tile they had (``kept`` rows)."""
    ws64 = configs.pick_config(64, 4096, "cuda", fast_memory=True)
    for B in batches:
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True, extended=True, extended_ws=True) == ws64
        assert configs.pick_config(B, 8192, "cuda", fast_memory=True, extended=True, extended_ws=True).block_b == kept
        h100 = configs.pick_config(B, 4096, "cuda", extended=True, extended_ws=True)
        if B > 64:
            assert h100 == ws64  # past 64 rows the H100 takes the 64-row tile too (v85)
        else:
            assert h100.block_b == kept
        assert configs.pick_config(B, 8192, "cuda", extended=True, extended_ws=True).block_b == kept  # H100, D = 8192
        # calls with entries alone: the 64-row tile at B = 17-32 on fast memory only, never past 64 rows here
        # (launch_fused runs their 128-row config on 64-row ws tiles itself)
        sparse = configs.pick_config(B, 4096, "cuda", fast_memory=True, sparse_processors=True)
        assert sparse == (ws64 if B <= 32 else configs.pick_config(B, 4096, "cuda", fast_memory=True))
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True, extended=True).block_b == kept
        assert configs.pick_config(B, 4096, "cuda", fast_memory=True).block_b == kept
    assert configs.pick_config(16, 4096, "cuda", fast_memory=True, extended=True, extended_ws=True).block_b == 16
    assert configs.EXTENDED_WS_MAX_HIDDEN == 4096
    from fsdist.ops import plan

    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    kw = dict(batch=kept, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0), path="fused")
    assert plan.plan_sample(**kw, extended=True).config == ws64
    assert plan.plan_sample(**kw).config.block_b == kept
    assert plan.plan_sample(**kw, extended=True, checked=True).config.block_b == kept  # a TP shard's layout
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: False)  # an H100
    h100 = plan.plan_sample(**kw, extended=True).config
    assert h100 == (ws64 if kept > 64 else configs.pick_config(kept, 4096, "cuda", extended=True))
    assert plan.plan_sample(**kw, extended=True, checked=True, n_shards=2).config.block_b == kept
    assert plan.plan_sample(**dict(kw, hidden_size=8192), extended=True).config.block_b == kept
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: False)
    assert plan.plan_sample(**kw, extended=True).config.block_b == kept


def test_pp_greedy_rule_batch_and_memory(monkeypatch):
    """All-greedy plain calls take the ping-pong kernel from PP_GREEDY_MIN_BATCH rows, on GPUs without fast memory, once
    PP_GREEDY_ON (on since v112's GPU run); switched off, never."""
    assert configs.PP_GREEDY_ON  # on by default
    monkeypatch.setattr(configs, "PP_GREEDY_ON", False)
    assert not configs.pp_greedy_rule(1024, False)
    monkeypatch.setattr(configs, "PP_GREEDY_ON", True)
    first = configs.PP_GREEDY_MIN_BATCH
    assert not configs.pp_greedy_rule(first - 1, False)
    assert configs.pp_greedy_rule(first, False) and configs.pp_greedy_rule(1024, False)
    assert not configs.pp_greedy_rule(1024, True)


def test_pp_greedy_needs_an_all_greedy_plain_call(monkeypatch):
    """fused_sample._pp_greedy: a scalar temperature 0 and a plain call (the ping-pong kernel writes no logprob fields,
    kept logits, header or parity copy and applies no processors); each condition alone turns it off."""
    from fsdist.ops import fused_sample
    from fsdist.ops.fused_sample import _pp_greedy
    from fsdist.ops.layout import BufferPair, CandidateLayout
    from fsdist.params import RowParams

    monkeypatch.setattr(configs, "PP_GREEDY_ON", True)
    cpu = torch.device("cpu")
    B = 512
    plain = CandidateLayout(1, 4, B)
    dest = BufferPair.alloc(plain, cpu)
    greedy = RowParams(0.0, 0, 0)

    def ok(batch=B, params=greedy, layout=plain, logprobs=False, extended=False, header=False):
        return _pp_greedy(batch, params, layout, dest, logprobs, extended, header, cpu)

    assert ok()
    assert not ok(batch=configs.PP_GREEDY_MIN_BATCH - 1)
    assert not ok(params=RowParams(torch.zeros(B), 0, 0))  # [B] temperatures: the kernel draws noise
    assert not ok(params=RowParams(0.7, 0, 0))
    assert not ok(logprobs=True) and not ok(extended=True) and not ok(header=True)
    assert not ok(layout=CandidateLayout(4, 4, B))
    assert not ok(params=dataclasses.replace(greedy, processing=object()))  # (any processors: only None counts)
    dest = dataclasses.replace(dest, parity=object())  # a double buffer's device parity (any: only None counts)
    assert not ok()
    dest = BufferPair.alloc(plain, cpu)
    assert ok()
    monkeypatch.setattr(fused_sample, "fast_memory", lambda device: True)  # (measured on an H100 only)
    assert not ok()


def test_fields_full_tile_sends_extended_calls_to_the_128_row_tile():
    """pick_config's fields_full_tile (plan_sample passes it with configs.WS_FIELDS_FULL_TILE on and no raw sums): an
    extended call of FIELDS_FULL_TILE_MIN_BATCH rows or more at D <= EXTENDED_WS_MAX_HIDDEN takes the ws 128-row tile
    (with the large-batch depth) instead of extended_ws's 64-row one; below that batch, or without it, the 64-row
    tile; at D = 8192 the 128-row tile either way; B <= 64 unchanged."""
    big = configs.FIELDS_FULL_TILE_MIN_BATCH
    kw = dict(extended=True, extended_ws=True, ws_kernel=True)
    for B in (big, 1024):
        cfg = configs.pick_config(B, 4096, "cuda", fields_full_tile=True, **kw)
        assert (cfg.block_b, cfg.ws) == (128, True)
        assert cfg == configs.pick_config(B, 4096, "cuda", ws_kernel=True)  # the plain call's tile
        assert configs.pick_config(B, 4096, "cuda", **kw).block_b == 64
        full = configs.pick_config(B, 8192, "cuda", fields_full_tile=True, **kw)
        assert configs.pick_config(B, 8192, "cuda", **kw) == full
    assert configs.pick_config(big - 1, 4096, "cuda", fields_full_tile=True, **kw).block_b == 64
    full = configs.pick_config(48, 4096, "cuda", fields_full_tile=True, **kw)
    assert configs.pick_config(48, 4096, "cuda", **kw) == full
