"""The tests of PyTorch's RPC suites that the conformance run does not run
on baton, each with its reason. The only reasons accepted: the test checks
TensorPipe's own internals (its transports, channels, its agent's debug
counters), or needs CUDA on a machine without one (CUDA tests run on the GPU
machine).

Keys: "Suite" (every test of it) or "Suite.test_name".
"""
from typing import Dict, Optional

TENSORPIPE = "checks TensorPipe's own agent internals"

EXCLUDED: Dict[str, str] = {
}


def reason_for(suite: str, test: str) -> Optional[str]:
    return EXCLUDED.get(f"{suite}.{test}", EXCLUDED.get(suite))
