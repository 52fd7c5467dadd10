"""Buffer reuse across steps with a deliberately slow rank (peer-store transport).

The race the double buffer prevents: after the barrier of step s, a fast rank reduces
step s and immediately runs stage 1 of step s+1, whose epilogue stores into *every*
rank's buffer -- including the slot the slow rank has not reduced yet. So the slow
rank is delayed exactly there: after the barrier, before its stage 2 (plus, on some
steps, before stage 1, which only makes the others wait). With two buffers (parity)
step s+1 writes the other copy and every step's tokens equal the reference. With the
``HeadTestSeam(num_buffers=1)`` knob the same schedule makes the slow rank reduce candidates
of the next step, and the test checks that this is noticed -- the race test is not
vacuous. (It is now usually caught twice: the next step's header no longer matches, so
the slow rank gets -1 and a TensorParallelMismatchError instead of wrong tokens; the
header is written first on the interpreter, but a GPU gives no such order, which is why
the double buffer, not the header, is what prevents the race.)

The reference is a ``collective`` head (whose all-gather cannot race) with the same
reduction, seeds and offsets: the tokens do not depend on the transport.
"""
import time

import pytest
import torch

import fsdist
from fsdist.tensor_parallel import HeadTestSeam, TensorParallelMismatchError
from tp_helpers import PEER_TRANSPORTS, gather_objects, grid, problem

V, D, B = 1000, 16, 16


def delays(step: int, scale: float = 1.0):
    """(before stage 1, before stage 2) sleep of the slow rank at `step`, varying per step."""
    return (0.05 if step % 3 == 1 else 0.0), scale * (0.08 + 0.06 * (step % 4))


def run_steps(ctx, reduction, transport, steps, num_buffers=2, slow=None, scale=1.0):
    W, h = problem(V, D, B, torch.float32, seed=21, scale=3.0, device=ctx.device)
    seam = HeadTestSeam(num_buffers=num_buffers)
    head = fsdist.ShardedFlashLMHead(D, V, transport=transport, reduction=reduction, params_dtype=torch.float32,
                                     device=ctx.device, test_seam=seam)
    head.load_full_weight(W)
    if slow is not None and ctx.rank == slow:
        def hook(point, step):
            before1, before2 = delays(step, scale)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            time.sleep(before1 if point == "before_stage1" else before2)

        seam.hook = hook
    seeds = torch.arange(B, dtype=torch.int64, device=ctx.device) + 100
    tokens = []
    for s in range(steps):
        # A mismatch error is raised after this rank took part in the step, so the ranks stay
        # in step whatever each one sees: record it and go on.
        try:
            tokens.append(head(h, seed=seeds, offset=1000 + s).tokens.cpu())
        except TensorParallelMismatchError:
            tokens.append(None)
    head.close()
    return tokens


# The slow rank of four (three fast peers storing into its copies) runs with candidates; group_logmass at 2 ranks.
reductions = grid("reduction", [("candidates",), ("group_logmass",)], lambda reduction: reduction == "candidates",
                  "the step buffers' parity and header are the transport's, the same for both reductions (which change "
                  "only what the entries hold): the slow rank of four runs with candidates")


def differs(got, ref):
    return got is None or not torch.equal(got, ref)


@pytest.mark.mpi(min_size=2)
@reductions
def test_slow_rank_with_double_buffering(dist_ctx, reduction):
    # The delays repeat every 12 steps: 2.5 periods at 2 ranks, one period beyond (CI time: 4 ranks on 2 cores)
    steps = 30 if dist_ctx.world_size == 2 else 12
    ref = run_steps(dist_ctx, reduction, "collective", steps)
    got = run_steps(dist_ctx, reduction, PEER_TRANSPORTS[0], steps, num_buffers=2, slow=dist_ctx.world_size - 1)
    bad = [s for s in range(steps) if differs(got[s], ref[s])]
    everyone = gather_objects(bad)
    assert all(not b for b in everyone), f"steps with wrong tokens or errors, per rank: {everyone}"


@pytest.mark.mpi(min_size=2)
@reductions
def test_single_buffer_race_is_detected(dist_ctx, reduction):
    steps = 10
    ref = run_steps(dist_ctx, reduction, "collective", steps)
    # Longer delays than above: the fast ranks must finish the next stage 1 inside the window.
    got = run_steps(dist_ctx, reduction, PEER_TRANSPORTS[0], steps, num_buffers=1, slow=dist_ctx.world_size - 1,
                    scale=2.5)
    bad = [s for s in range(steps) if differs(got[s], ref[s])]
    everyone = gather_objects(bad)
    print(f"[rank {dist_ctx.rank}] {reduction}, one buffer: noticed steps per rank {everyone}")
    assert sum(len(b) for b in everyone) > 0, "single buffering with a slow rank went unnoticed"
    assert everyone[-1], "the slow rank should be the one reading overwritten slots"
