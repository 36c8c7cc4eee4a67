"""Backend selection from Python: DevicePolicy parsing, the device report, and
GraphDevices / FlexibleSession / DeviceRouter running on the CPU (and on
Vulkan, when it is available, against the CPU)."""
import json

import numpy as np
import pytest

import pyrlx as rlx

CPU = rlx.DevicePolicy.only(["cpu"])


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("rlx-cache")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, cache_dir):
    """Calibration caches in a temp dir; no device variable leaks in from the caller's environment."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(cache_dir))
    for v in ("RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE", "RLX_DEVICE_CHAIN",
              "RLX_BENCHMARK_PICK"):
        monkeypatch.delenv(v, raising=False)


def model():
    with rlx.graph("mlp") as g:
        x = g.input("x", (4, 8))
        g.output((x @ g.param("w", (8, 5)) + g.param("b", (5,))).tanh())
    return g


def expected(x, w, b):
    return np.tanh(x @ w + b)


@pytest.fixture
def data(rng):
    return (rng.standard_normal((4, 8), dtype=np.float32), rng.standard_normal((8, 5), dtype=np.float32),
            rng.standard_normal(5, dtype=np.float32))


def test_policy_parsing():
    p = rlx.DevicePolicy.only(["cpu", "nvidia"]).with_deny(["wgpu"]).with_prefer(["cuda"])
    assert p.allowed == ["cpu", "cuda"]
    assert p.denied == ["gpu"]
    assert p.preferred == ["cuda"]
    assert p.allows("cpu") and not p.allows("vulkan")
    assert "allow-list" in p.blocked_reason("vulkan")
    assert p.strategy == ("cost_model", 0)
    assert p.with_benchmark_pick(20).strategy == ("benchmark", 20)
    assert p.strategy == ("cost_model", 0)  # with_* return copies
    assert rlx.DevicePolicy.all().allowed is None
    assert rlx.DevicePolicy.all().with_default_device("cpu").default_device == "cpu"
    assert rlx.DevicePolicy.all().with_chain(["cuda", "cpu"]).chain == ["cuda", "cpu"]
    assert rlx.parse_device("nvidia") == "cuda" and rlx.parse_device("wgpu") == "gpu"
    with pytest.raises(rlx.Error, match="'quantum'"):
        rlx.DevicePolicy.only(["cpu", "quantum"])
    with pytest.raises(rlx.Error, match="runs must be positive"):
        rlx.DevicePolicy.all().with_benchmark_pick(0)


def test_policy_from_env(monkeypatch):
    monkeypatch.setenv("RLX_DEVICES", "cpu,vulkan")
    monkeypatch.setenv("RLX_DENY_DEVICES", "vulkan")
    monkeypatch.setenv("RLX_BENCHMARK_PICK", "3")
    monkeypatch.setenv("RLX_DEVICE_CHAIN", "vulkan, cpu")
    p = rlx.DevicePolicy.from_env()
    assert p.allowed == ["cpu", "vulkan"] and p.denied == ["vulkan"]
    assert p.strategy == ("benchmark", 3)
    assert p.chain == ["vulkan", "cpu"]
    assert "RLX_DENY_DEVICES" in p.blocked_reason("vulkan")
    monkeypatch.setenv("MYAPP_DEVICES", "metal")
    q = rlx.DevicePolicy.from_env_key("MYAPP")
    assert q.allowed == ["metal"] and q.denied == []
    monkeypatch.setenv("RLX_DEVICES", "cpu,tpu9")
    with pytest.raises(rlx.Error, match="RLX_DEVICES.*'tpu9'"):
        rlx.DevicePolicy.from_env()
    monkeypatch.setenv("RLX_DEVICES", "cpu")
    monkeypatch.setenv("RLX_BENCHMARK_PICK", "many")
    with pytest.raises(rlx.Error, match="RLX_BENCHMARK_PICK"):
        rlx.DevicePolicy.from_env()


def test_device_report_and_manifest():
    g = model()
    report = rlx.device_report(g, CPU)
    assert len(report) == 9 and report.recommended == "cpu"
    best = report[0]
    assert isinstance(best, rlx.DeviceCandidate)
    assert best.label == "cpu" and best.device == "cpu" and best.recommended and best.viable
    assert "clone" in best.capabilities
    assert best.estimate_seconds > 0 and "FLOP" in best.estimate_explain
    assert best.why == "the only viable device"
    vulkan = next(c for c in report if c.label == "vulkan")
    assert not vulkan.viable and ("blocked" in vulkan.why or "unavailable" in vulkan.why)
    assert "recommended: cpu" in report.to_text()
    assert rlx.fastest_device_for(g, CPU) == "cpu"
    assert rlx.resolve_device(g, "cpu") == "cpu"
    with pytest.raises(rlx.Error, match="metal.*unavailable"):
        rlx.resolve_device(g, "metal")
    assert "cpu" in rlx.devices_for(g)
    assert "typed_io" in rlx.advisory_capabilities("cpu")
    manifest = json.loads(rlx.backends_manifest())
    rows = {row["device"]: row for row in manifest["backends"]}
    assert rows["cpu"]["available"] and rows["cpu"]["backend"] == "cpu"
    assert not rows["metal"]["available"] and rows["metal"]["reason"]
    assert set(rlx.available_devices()) == {d for d, row in rows.items() if row["available"]}


def test_graph_devices_run_on_cpu(data):
    x, w, b = data
    devices = ["cpu"] + (["vulkan"] if rlx.is_available("vulkan") else [])
    runner = rlx.GraphDevices.with_policy(model(), rlx.DevicePolicy.only(devices))
    runner.set_param("w", w)
    runner.set_param_typed("b", b.astype(np.float64).tobytes(), "f64")  # converted to the param's f32
    for d in devices:
        (y,) = runner.run(d, {"x": x})
        np.testing.assert_allclose(y, expected(x, w, b), rtol=1e-4, atol=1e-4)
    assert sorted(runner.cached_devices()) == sorted(devices)
    w2 = w * 2
    runner.set_param("w", w2)  # mirrored to every cached device
    for d in devices:
        np.testing.assert_allclose(runner.run(d, {"x": x})[0], expected(x, w2, b), rtol=1e-4, atol=1e-4)
    (y,) = runner.run_resolved({"x": x}, device="cpu")
    np.testing.assert_allclose(y, expected(x, w2, b), rtol=1e-4, atol=1e-4)
    device, (y,) = runner.run_chain({"x": x}, chain=["metal", "cpu"])
    assert device == "cpu"
    assert [d for d, _ in runner.failures()] == ["metal"]
    assert runner.run_try(["cpu"], {"x": x})[0] == "cpu"
    results = runner.benchmark({"x": x}, runs=2)
    assert all(isinstance(r, rlx.DeviceBenchResult) for r in results)
    assert {r.device for r in results} == set(devices) and all(r.ok and r.runs == 2 for r in results)
    assert all(0 < r.min_ms <= r.median_ms for r in results)
    assert runner.benchmark_winner in devices
    assert runner.fastest() in devices and runner.resolve("cpu") == "cpu"
    assert sorted(runner.devices()) == sorted(devices) and runner.report().recommended in devices
    runner.sync_params_to_all()
    runner.invalidate_cache()
    assert runner.cached_devices() == []
    assert sorted(runner.warm_all()) == sorted(devices)
    runner.compile("cpu")
    with pytest.raises(rlx.Error, match="set_param_typed.*40 bytes"):
        runner.set_param_typed("b", b"\0" * 8, "f64")
    with pytest.raises(rlx.Error, match="metal.*allow-list"):
        runner.run("metal", {"x": x})


def test_flexible_session(data):
    x, w, b = data
    g = model()
    session = rlx.FlexibleSession(CPU)
    compiled = session.compile_resolved(g, device="cpu")
    compiled.set_param("w", w)
    compiled.set_param("b", b)
    np.testing.assert_allclose(compiled.run({"x": x})[0], expected(x, w, b), rtol=1e-4, atol=1e-4)
    assert session.resolve(g) == "cpu"
    with pytest.raises(rlx.Error, match="compile_on.*vulkan.*allow-list"):
        session.compile_on(g, "vulkan")
    assert rlx.FlexibleSession.from_env().policy == rlx.DevicePolicy.from_env()


def test_device_router(data):
    x, w, b = data
    router = rlx.DeviceRouter(model(), policy=CPU).with_rebench_on_throttle(False)
    assert router.warmed == ["cpu"]
    router.set_param("w", w)
    router.set_param("b", b)
    device, (y,) = router.run({"x": x})
    assert device == "cpu" and router.current == "cpu"
    np.testing.assert_allclose(y, expected(x, w, b), rtol=1e-4, atol=1e-4)
    assert router.run_chain({"x": x})[0] == "cpu"
    np.testing.assert_allclose(router.run_on("cpu", {"x": x})[0], y)
    clock = {"mhz": 3000.0}
    router.set_snapshot_source(lambda: (clock["mhz"], 3000.0))
    router.set_rebench_on_throttle(True, check_every_s=0)
    router.run({"x": x})
    assert router.rebenchmarks == 0
    clock["mhz"] = 1200.0  # throttled: below 85% of the maximum
    router.run({"x": x})
    assert router.rebenchmarks == 1
    with pytest.raises(rlx.Error, match="no device compiled"):
        rlx.DeviceRouter(model(), policy=rlx.DevicePolicy.only(["metal"]))
