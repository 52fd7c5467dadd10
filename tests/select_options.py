"""Forcing select_filtered's options in whole fsdist calls, for tests that compare its paths.

``force_select_options(monkeypatch, winners=False)``: every ``launch_select_filtered`` call that
``fsdist.sample`` and the TP head make from then on (until ``monkeypatch`` undoes it) gets these
options on top of its own; ``winners=False`` sends the rows U cannot prove to the fallback, as
before the min-p proof from the tiles' winners.
"""
import fsdist.ops.select_filtered as sf
import fsdist.sampling as sampling
import fsdist.tensor_parallel.candidates as candidates


def force_select_options(monkeypatch, **options):
    real = sf.launch_select_filtered

    def launch(*args, **kwargs):
        return real(*args, **{**kwargs, **options})
    for module in (sampling, candidates):
        monkeypatch.setattr(module, "launch_select_filtered", launch)
