"""`berth sim --data-locality`: the synthetic dataset assignment, host caches and staging figures."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from berth_tools.sim.data import GIB, DataModel, DataSpec
from berth_tools.sim.trace import TraceJob, parse_trace

from .test_cli import ROOT, _app


def _jobs(n: int, tenant: str = "a") -> list[TraceJob]:
    return [TraceJob(f"j{i}", float(i), tenant, 1, "V100", 60.0) for i in range(n)]


def test_synthetic_datasets_repeat_per_tenant_and_are_deterministic() -> None:
    spec = DataSpec(datasets_per_tenant=4)
    jobs = _jobs(200) + [TraceJob(f"b{i}", 0.0, "b", 1, "V100", 60.0) for i in range(50)]
    one, two = DataModel(spec, jobs), DataModel(spec, jobs)
    assert one.source == two.source and one.size == two.size and one.synthetic
    a = [one.source[t.job_id] for t in jobs if t.tenant == "a"]
    assert len(set(a)) <= 4 and all(s.startswith("s3://data/a/") for s in a)
    # Zipf: the favourite dataset is read by more jobs than the least one
    counts = sorted((a.count(s) for s in set(a)), reverse=True)
    assert counts[0] > counts[-1]
    assert not set(a) & {one.source[t.job_id] for t in jobs if t.tenant == "b"}


def test_a_traces_dataset_column_wins() -> None:
    text = (
        "job_id,submit_s,tenant,gpus,gpu_type,duration_s,dataset,dataset_gib\nx,0,a,1,V100,60,s3://d/x/,7\n"
    )
    model = DataModel(DataSpec(), parse_trace(text))
    assert not model.synthetic and model.source["x"] == "s3://d/x/" and model.size["s3://d/x/"] == 7 * GIB


def test_a_second_job_on_a_cached_host_stages_a_fraction_of_the_first() -> None:
    spec = DataSpec(cache_gib=1000, s3_gbps=10, hit_s=5, median_gib=100, size_sigma=0)
    model = DataModel(spec, _jobs(3))
    model.source = {"j0": "s3://d/x/", "j1": "s3://d/x/", "j2": "s3://d/x/"}
    model.size = {"s3://d/x/": 100 * GIB}
    model.stage_onprem("j0", ["h1"], holder_free=False)
    model.stage_onprem("j1", ["h1"], holder_free=True)  # a hit
    model.stage_onprem("j2", ["h2"], holder_free=False)  # another host: a miss
    s = model.summary()
    assert (s["cache_hits"], s["cache_misses"]) == (1, 2) and s["bytes_staged_onprem"] == 200 * GIB
    first = 5 + 100 * GIB * 8 / 10e9
    assert s["second_job_staging_ratio_p50"] == round(5 / first, 4) < 0.1
    assert model.cached("h1") == frozenset({"s3://d/x/"}) and model.cached("h3") == frozenset()
    # an LRU cache smaller than two datasets keeps only the latest
    small = DataModel(DataSpec(cache_gib=150), _jobs(2))
    small.source, small.size = (
        {"j0": "s3://d/x/", "j1": "s3://d/y/"},
        {"s3://d/x/": 100 * GIB, "s3://d/y/": 100 * GIB},
    )
    small.stage_onprem("j0", ["h1"], False)
    small.stage_onprem("j1", ["h1"], False)
    assert small.cached("h1") == frozenset({"s3://d/y/"})


def test_sim_reports_bytes_staged_with_and_without_the_preference() -> None:
    res = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            str(ROOT / "examples/traces/tiresias-60.csv"),
            "--cluster",
            str(ROOT / "examples/clusters/small.yaml"),
            "--data-locality",
            "--output",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    loc = json.loads(res.output.splitlines()[0])["data_locality"]
    assert loc["with"]["datasets"] == "synthetic" and loc["with"]["mode"] == "prefer"
    assert loc["without"]["bytes_staged"] - loc["with"]["bytes_staged"] == loc["bytes_saved"]
    assert loc["with"]["cache_hits"] >= loc["without"]["cache_hits"]
    assert loc["bytes_saved"] > 0
    res = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            str(ROOT / "examples/traces/tiresias-60.csv"),
            "--cluster",
            str(ROOT / "examples/clusters/small.yaml"),
            "--data-locality",
        ],
    )
    assert res.exit_code == 0 and "data locality" in res.output and "bytes_saved" in res.output


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            str(ROOT / "examples/traces/tiresias-60.csv"),
            "--cluster",
            str(ROOT / "examples/clusters/small.yaml"),
            "--output",
            "json",
        ],
    )
    assert res.exit_code == 0 and "data_locality" not in json.loads(res.output.splitlines()[0])
