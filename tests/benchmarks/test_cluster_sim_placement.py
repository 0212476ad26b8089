"""benchmarks/cluster_sim.py's placement figures from hand-made events, without Ray: the overlap peak is the
at-once ceiling, and the trials Ray gave one GPU show packing even when their units never overlapped (as on a
loaded machine, where the cluster group's one-second units start seconds apart)."""
from __future__ import annotations

from tests.helpers import benchmark_imports


def unit(set_index: int, start: float, gpu: str, node: str = "node-a") -> dict:
    return {"key": ("tuning", 0, set_index, 0), "start": start, "end": start + 1.0, "node": node,
            "gpu_ids": (gpu,), "pid": 100 + set_index}


def test_staggered_trials_on_one_gpu_count_as_packed_but_never_as_running_at_once():
    with benchmark_imports():
        import cluster_sim

        staggered = [unit(i, start=2.0 * i, gpu="0") for i in range(4)] + [unit(4, 0.0, "1")]
        assert max(cluster_sim.peak_sharing(staggered).values()) == 1
        assert cluster_sim.trials_by_gpu(staggered) == {("node-a", "0"): 4, ("node-a", "1"): 1}


def test_the_same_trial_twice_on_a_gpu_is_one_trial_and_nodes_keep_their_gpus_apart():
    with benchmark_imports():
        import cluster_sim

        units = [unit(0, 0.0, "0"), unit(0, 1.0, "0"), unit(1, 0.0, "0", node="node-b")]
        assert cluster_sim.trials_by_gpu(units) == {("node-a", "0"): 1, ("node-b", "0"): 1}
        overlapping = [unit(i, 0.5 * i, "0") for i in range(3)]
        assert cluster_sim.peak_sharing(overlapping) == {("node-a", "0"): 2}


def test_the_packing_verdict_reads_the_trials_given_a_gpu():
    with benchmark_imports():
        import cluster_sim

        def study(given: int, peak: int) -> dict:
            return {"returncode": 0, "gpus_per_trial": 0.25,
                    "units": {"trained": 16, "expected": 16, "trained_more_than_once": 0, "without_gpu_ids": 0},
                    "placement": {"most_trials_on_one_gpu": peak, "allowed_per_gpu": 4,
                                  "most_trials_given_one_gpu": given}}

        packed = cluster_sim.verdicts({"studies": {"s": study(given=4, peak=3)}})
        assert all(packed.values())
        spread = cluster_sim.verdicts({"studies": {"s": study(given=3, peak=3)}})
        assert spread == {**packed, "s: four trials shared a GPU": False}
        crowded = cluster_sim.verdicts({"studies": {"s": study(given=5, peak=5)}})
        assert not crowded["s: no GPU held more than 1/gpus_per_trial trials"]
