"""Issue 48's simulated GPU cluster, small (benchmarks/cluster_sim.py --small): two Ray nodes on 127.0.0.1 declaring 4
GPUs each that this machine does not have, one study of 8 trials at gpus_per_trial 0.25 with compute.simulate_gpus
through `gtep tune --address`, units that sleep a second. Asserts placement and packing from the events' GPU ids,
never timings: every unit trained once and recorded the GPU Ray gave it, no logical GPU held more than four trials
at once, and Ray gave four trials one GPU (counted over the study: under load their one-second units need not
overlap)."""
from __future__ import annotations

import pytest

from tests.helpers import benchmark_imports

pytestmark = pytest.mark.cluster



@pytest.fixture(scope="module")
def simulation(tmp_path_factory):
    import ray

    # this worker's shared Ray (tests/conftest.py) gives its CPUs back while four more Ray processes run;
    # the next module that needs it starts it again
    if ray.is_initialized():
        ray.shutdown()
    with benchmark_imports():
        import cluster_sim

        folder = tmp_path_factory.mktemp("cluster-sim")
        options = cluster_sim.Options.small(folder)
        options.tracking = "server"  # the driver writes through --tracking-uri, as on a cluster; its own sqlite
        yield cluster_sim, cluster_sim.simulate(options), folder  # store is what every other study test uses


def test_every_check_holds(simulation):
    cluster_sim, figures, folder = simulation
    failed = [name for name, ok in figures["verdicts"].items() if not ok]
    assert not failed, f"{failed}: see {folder}/figures.json"
    assert any("four trials shared a GPU" in name for name in figures["verdicts"])


def test_fractional_trials_pack_onto_the_declared_gpus(simulation):
    _, figures, _ = simulation
    study = figures["studies"]["g0p25-c8"]
    placement, units = study["placement"], study["units"]
    assert units["trained"] == units["expected"] == 8 * 2
    assert placement["allowed_per_gpu"] == 4 and placement["most_trials_given_one_gpu"] >= 4, "Ray packs, not spreads"
    assert all(0 < peak <= 4 for peak in placement["peak_by_gpu"].values())
    assert placement["logical_gpus_used"] <= 2 * 4, "only the GPUs the nodes declared"
    assert all(name.split("/")[1] in {"0", "1", "2", "3"} for name in placement["peak_by_gpu"])


def test_the_controller_cost_is_measured(simulation):
    _, figures, _ = simulation
    study = figures["studies"]["g0p25-c8"]
    assert study["driver"]["cpu_ms_per_unit"] > 0 and study["driver"]["cpu_s_total"] > 0
    assert figures["tracking"] == "server" and study["tracking_server"]["cpu_ms_per_unit"] > 0
    assert 0 < study["slots"]["busy_share"] < 1
    assert study["trial_processes"]["processes"] >= 1 and study["trial_processes"]["pss_median_mib"] > 0
