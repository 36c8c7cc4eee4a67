"""pyrlx's backend selection (docs/backend-selection.md): devices are labels, "cpu", "vulkan", ... Imported by the
package's __init__ once everything below it exists; every name here is also pyrlx's."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from . import _pyrlx as _C
from . import CompiledGraph, DTypeLike, Error, Graph, Session, _dtype_name, _to_device_array, parse_device

# ---- backend selection (docs/backend-selection.md): devices are labels, "cpu", "vulkan", ... ----
DevicePolicy = _C.DevicePolicy
DeviceCandidate = _C.DeviceCandidate
DeviceReport = _C.DeviceReport
DeviceBenchResult = _C.DeviceBenchResult


def _policy(policy: Optional[DevicePolicy]) -> DevicePolicy:
    if policy is None:
        return DevicePolicy.all()
    if not isinstance(policy, DevicePolicy):
        raise Error(f"expected an rlx.DevicePolicy, got {type(policy).__name__}")
    return policy


def _native_graph(g: Graph) -> Any:
    if not isinstance(g, Graph):
        raise Error(f"expected an rlx.Graph, got {type(g).__name__}")
    return g._g


def _named(inputs: dict) -> list:
    return [(name,) + _to_device_array(value) for name, value in inputs.items()]


def device_report(g: Graph, policy: Optional[DevicePolicy] = None) -> DeviceReport:
    """Every device with its blockers, cost estimate and why; report[0] is the recommended one."""
    return _C.device_report(_native_graph(g), _policy(policy))


def fastest_device_for(g: Graph, policy: Optional[DevicePolicy] = None) -> str:
    return _C.fastest_device_for(_native_graph(g), _policy(policy))


def resolve_device(g: Graph, device: Optional[str] = None, policy: Optional[DevicePolicy] = None) -> str:
    """The hint, else the policy's default device, else RLX_DEVICE, else the cost-model pick."""
    return _C.resolve_device(_native_graph(g), device, _policy(policy))


def devices_for(g: Graph) -> list: return _C.devices_for(_native_graph(g))
def advisory_capabilities(device: str) -> list: return _C.advisory_capabilities(device)
def backends_manifest() -> str:
    """JSON: every device, whether a backend is built in, whether it is available here and why not."""
    return _C.backends_manifest()


class GraphDevices:
    """One graph, compiled lazily per device; params set here are mirrored to every device."""

    def __init__(self, g: Graph, policy: Optional[DevicePolicy] = None):
        self._r = _C._GraphDevices(_native_graph(g), _policy(policy))

    @classmethod
    def with_policy(cls, g: Graph, policy: DevicePolicy) -> "GraphDevices": return cls(g, policy)

    def set_param(self, name: str, value: Any) -> None:
        self._r.set_param(name, *_to_device_array(value))

    def set_param_typed(self, name: str, data: bytes, dtype: DTypeLike) -> None:
        """Raw bytes of the param's shape in `dtype`, converted to the param's dtype."""
        self._r.set_param_typed(name, bytes(data), _dtype_name(dtype))

    def sync_params_to_all(self) -> None: self._r.sync_params_to_all()
    def devices(self) -> list: return self._r.devices()
    def report(self) -> DeviceReport: return self._r.report()
    def fastest(self) -> str: return self._r.fastest()
    def resolve(self, device: Optional[str] = None) -> str: return self._r.resolve(device)
    def compile(self, device: str) -> None: self._r.compile(device)
    def run(self, device: str, inputs: dict) -> list: return self._r.run(device, _named(inputs))

    def run_resolved(self, inputs: dict, device: Optional[str] = None) -> list:
        return self._r.run_resolved(_named(inputs), device)

    def run_resolved_with_inputs(self, device: Optional[str], inputs: dict) -> list:
        return self.run_resolved(inputs, device)

    def run_chain(self, inputs: dict, chain: Optional[Sequence[str]] = None) -> tuple:
        """(device, outputs) from the first device of the chain that runs."""
        return self._r.run_chain(_named(inputs), None if chain is None else list(chain))

    def run_try(self, devices: Sequence[str], inputs: dict) -> tuple:
        return self._r.run_try(list(devices), _named(inputs))

    def failures(self) -> list: return self._r.failures()
    def warm_all(self) -> list: return self._r.warm_all()
    def benchmark(self, inputs: dict, runs: int = 20) -> list: return self._r.benchmark(_named(inputs), runs)
    @property
    def benchmark_winner(self) -> Optional[str]: return self._r.benchmark_winner
    def invalidate_cache(self) -> None: self._r.invalidate_cache()
    def cached_devices(self) -> list: return self._r.cached_devices()


class FlexibleSession:
    """Like Session, with the device chosen per compile by a policy and an optional hint."""

    def __init__(self, policy: Optional[DevicePolicy] = None):
        self.policy = _policy(policy)

    @classmethod
    def from_env(cls) -> "FlexibleSession": return cls(DevicePolicy.from_env())

    def resolve(self, g: Graph, device: Optional[str] = None) -> str: return resolve_device(g, device, self.policy)

    def compile_resolved(self, g: Graph, device: Optional[str] = None, **options) -> CompiledGraph:
        return Session(self.resolve(g, device)).compile(g, **options)

    def compile_on(self, g: Graph, device: str, **options) -> CompiledGraph:
        reason = self.policy.blocked_reason(device)
        if reason:
            raise Error(f"compile_on: device '{parse_device(device)}' is {reason}")
        return Session(device).compile(g, **options)


class DeviceRouter:
    """Serving wrapper: every viable device is compiled at construction; runs go to the pick."""

    def __init__(self, g: Graph, policy: Optional[DevicePolicy] = None):
        self._r = _C._DeviceRouter(_native_graph(g), _policy(policy))

    @classmethod
    def from_env(cls, g: Graph) -> "DeviceRouter": return cls(g, DevicePolicy.from_env())

    def set_param(self, name: str, value: Any) -> None: self._r.set_param(name, *_to_device_array(value))

    def set_param_typed(self, name: str, data: bytes, dtype: DTypeLike) -> None:
        self._r.set_param_typed(name, bytes(data), _dtype_name(dtype))

    def set_rebench_on_throttle(self, on: bool, check_every_s: float = 1.0) -> None:
        self._r.set_rebench_on_throttle(on, check_every_s)

    def with_rebench_on_throttle(self, on: bool, check_every_s: float = 1.0) -> "DeviceRouter":
        self.set_rebench_on_throttle(on, check_every_s)
        return self

    def set_snapshot_source(self, fn) -> None:
        """fn() returns (current MHz, maximum MHz); below 85% of the maximum counts as throttled."""
        self._r.set_snapshot_source(fn)

    def run(self, inputs: dict, device: Optional[str] = None) -> tuple: return self._r.run(_named(inputs), device)
    def run_chain(self, inputs: dict) -> tuple: return self._r.run_chain(_named(inputs))
    def run_on(self, device: str, inputs: dict) -> list: return self._r.run_on(device, _named(inputs))
    @property
    def current(self) -> Optional[str]: return self._r.current
    @property
    def rebenchmarks(self) -> int: return self._r.rebenchmarks
    @property
    def warmed(self) -> list: return self._r.warmed
