"""A CPU-only torch.accelerator for Debian's torch 1.13.

Today's pytorch/examples call torch.accelerator (PyTorch >= 2.6), which
torch 1.13 lacks. On this path (python/compat/shims on PYTHONPATH) Python
imports this module at start-up; it adds the few functions the examples use,
answering as a machine without an accelerator does. It never replaces a
torch that has its own.
"""
try:
    import torch
except ImportError:  # an interpreter without torch: nothing to shim
    torch = None

if torch is not None and not hasattr(torch, "accelerator"):
    import types

    accelerator = types.ModuleType("torch.accelerator")
    accelerator.is_available = lambda: False
    accelerator.current_accelerator = lambda check_available=False: None
    accelerator.device_count = lambda: 0
    accelerator.current_device_index = lambda: -1

    class _DeviceIndex:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    accelerator.device_index = _DeviceIndex
    torch.accelerator = accelerator
