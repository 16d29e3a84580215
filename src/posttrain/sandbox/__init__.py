"""posttrain.sandbox: isolated workspaces and process execution for episodes and verifiers.

    from posttrain.sandbox import Limits, open_sandbox, SandboxPool

    with open_sandbox(Limits(wall_s=5, memory_mb=256)) as sb:
        sb.write_file("main.py", "print(6 * 7)")
        result = sb.run("python3 main.py")      # RunResult(exit_code=0, stdout="42\\n", ...)

The default backend is bubblewrap (see `posttrain.sandbox.bwrap` for what each isolation layer
covers and what it does not); `process` is an unisolated, opt-in fallback. Names are imported
lazily so that the supervisor process (which imports this package) starts fast.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Limits": "base", "RunResult": "base", "LimitReason": "base", "Sandbox": "base",
    "SandboxInfo": "base", "SandboxError": "base", "SandboxBroken": "base",
    "SandboxUnavailable": "base", "WorkspacePathError": "base",
    "open_sandbox": "factory", "SandboxPool": "pool",
    "isolation_layers": "layers", "Layer": "layers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"posttrain.sandbox.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'posttrain.sandbox' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
