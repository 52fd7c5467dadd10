"""bench/filter_probe.py's --interleave bookkeeping (no GPU: fake graphs stand in for the captured ones)."""
import os
import statistics
import sys
import types


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import filter_probe  # noqa: E402


def _pdl_runs(*settings):
    seen, runs = {}, []
    for s in settings:
        seen[s] = seen.get(s, 0) + 1
        runs.append((s, f" pdl={s}" + (f"#{seen[s]}" if seen[s] > 1 else "")))
    return runs


def test_tag_of_takes_the_longest_tag():
    runs = _pdl_runs("noskip", "skip", "noskip", "skip")
    assert filter_probe._tag_of("plain pdl=skip#2", runs) == " pdl=skip#2"
    assert filter_probe._tag_of("plain pdl=noskip", runs) == " pdl=noskip"
    assert filter_probe._tag_of("k50+p0.9 #2 pdl=skip", runs) == " pdl=skip"
    assert filter_probe._tag_of("plain", [(None, "")]) == ""


def test_each_graph_against_its_case_under_the_first_setting():
    """Every graph timed in each round, the order reversed each round; each compared with the same case under the
    first --pdl setting, round by round: a drift that grows with every graph timed falls on both alike, and a 2%
    slower setting comes out 2% slower in every round."""
    runs = _pdl_runs("noskip", "skip")
    cost = {"plain pdl=noskip": 100.0, "plain pdl=skip": 102.0, "min_p pdl=noskip": 200.0, "min_p pdl=skip": 200.0}
    timed = []

    def time_one(name):  # (the "graphs" here are their names)
        timed.append(name)
        return cost[name] * (1.0 + 0.01 * len(timed))  # the machine slows 1% a graph timed
    args = types.SimpleNamespace(interleave=6, interleave_reps=5)
    out = filter_probe._interleaved({n: n for n in cost}, runs, 64, args, flush=None, time_one=time_one)
    assert len(timed) == 24 and timed[:4] == list(cost) and timed[4:8] == list(cost)[::-1]
    inter = out["_interleaved"]
    assert set(inter["paired"]) == {"plain pdl=skip", "min_p pdl=skip"}
    plain, min_p = inter["paired"]["plain pdl=skip"], inter["paired"]["min_p pdl=skip"]
    assert plain["against"] == "plain pdl=noskip" and plain["rounds"] == 6 and plain["faster"] == 0
    assert abs(plain["median"] - 1.02) < 0.015, plain
    assert abs(min_p["median"] - 1.0) < 0.015, min_p
    assert all(len(v) == 6 for v in inter["samples"].values())
    assert all(out[n] == statistics.median(inter["samples"][n]) for n in cost)
