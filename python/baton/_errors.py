"""How baton's status codes become Python exceptions.

Every error carries `code` (the absl status code name, e.g. "DEADLINE_EXCEEDED"),
`worker` (the worker called, when known) and `function` (what was called).
- DEADLINE_EXCEEDED: RpcTimeoutError, a TimeoutError.
- UNAVAILABLE: WorkerUnavailableError, a ConnectionError (dead or unreachable worker).
- INVALID_ARGUMENT: InvalidArgumentError, a ValueError (torch's init_rpc
  raises ValueError for the device maps it refuses).
- All three are also RuntimeErrors, as torch raises them ("except RuntimeError"
  catches a timeout).
- A Python exception raised by the remote function is raised again with its own
  type when that type can be imported and built from a message; otherwise
  RemoteException (when building it failed, with torch's "Failed to create
  original exception type ... Original exception on remote side was ...").
  The message holds the remote traceback.
- Anything else: RpcError subclasses of RuntimeError (torch raises RuntimeError).
"""
import builtins
import importlib
import re

from baton import _C

CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
CODE_NUMBERS = {name: number for number, name in CODES.items()}
PYTHON_ERROR_PREFIX = _C.PYTHON_ERROR_PREFIX


class RpcError(Exception):
    """Base of baton's errors: `code`, `worker`, `function` say what failed where."""

    code = "UNKNOWN"
    worker = None
    function = None


class RpcRuntimeError(RpcError, RuntimeError):
    """An RPC failed (torch raises RuntimeError for these)."""


class RpcTimeoutError(RpcRuntimeError, TimeoutError):
    """The call did not complete by its deadline (DEADLINE_EXCEEDED)."""


class WorkerUnavailableError(RpcRuntimeError, ConnectionError):
    """The worker is dead or cannot be reached (UNAVAILABLE)."""


class InvalidArgumentError(RpcRuntimeError, ValueError):
    """An argument or option was refused (INVALID_ARGUMENT), e.g. a device
    map that names a device a worker does not have."""


class RemoteException(RpcRuntimeError):
    """A remote Python exception whose type could not be rebuilt here."""

    remote_type = None


def _annotate(exc, code, worker, function):
    for name, value in (("code", code), ("worker", worker), ("function", function)):
        try:
            setattr(exc, name, value)
        except (AttributeError, TypeError):
            pass
    return exc


def _rebuild_python_error(type_name, text):
    module_name, _, qualname = type_name.partition(".")
    # The module part may itself contain dots: find the longest importable one.
    parts = type_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name, qualname = ".".join(parts[:cut]), parts[cut:]
        try:
            obj = builtins if module_name == "builtins" else importlib.import_module(module_name)
        except Exception:  # noqa: BLE001  (any import failure: try a shorter module)
            continue
        try:
            for attr in qualname:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        if isinstance(obj, type) and issubclass(obj, BaseException):
            try:
                return obj(text)
            except Exception as e:  # noqa: BLE001  (a constructor that wants other arguments)
                # torch's words, which programs and its suites match.
                exc = RemoteException(
                    f"Failed to create original exception type. Error msg was {e} Original "
                    f"exception on remote side was {type_name}: {text}")
                exc.remote_type = type_name
                return exc
        break
    exc = RemoteException(f"{type_name}: {text}")
    exc.remote_type = type_name
    return exc


_WIRE_CALL = re.compile(r"rpc to worker '[^']*' \(id -?\d+\), function '__baton\.py\.(?:call|remote)': ")


# This worker's name, set by init_rpc: a reply that could not be sent back
# to it names it.
SELF_NAME = None
_NO_MAP = re.compile(
    r"cannot send a tensor on device \S+ to worker '([^']*)': no device map applies")


def _device_map_hint(message):
    """torch's words for a CUDA tensor with no device map (its suites match
    them), after baton's own."""
    m = _NO_MAP.search(message)
    if m is None:
        return message
    if SELF_NAME is not None and m.group(1) == SELF_NAME:
        return (f"{message}. Response device mapping is not available for destination "
                f"{SELF_NAME}: the callee returned a CUDA tensor, and neither side set a "
                "device map for the reply")
    return (f"{message}. TensorPipe RPC backend only supports CPU tensors by default, please "
            "move your tensors to CPU before sending them over RPC, or call `set_device_map` on "
            "`TensorPipeRpcBackendOptions` to explicitly configure device mapping")


def from_status(code, message, worker=None, function=None):
    """The exception for a failed call's (code number, message)."""
    name = CODES.get(code, "UNKNOWN")
    if name == "INVALID_ARGUMENT":
        message = _device_map_hint(message)
    where = []
    if worker is not None:
        where.append(f"on worker '{worker}'")
    if function is not None:
        where.append(f"running {function}")
    prefix = ("rpc " + " ".join(where) + ": ") if where else ""
    # The C++ agent names the call by its wire function; the prefix above
    # names it the Python way.
    message = _WIRE_CALL.sub("", message)
    if name == "UNKNOWN" and PYTHON_ERROR_PREFIX in message:
        head, _, rest = message.partition(PYTHON_ERROR_PREFIX)
        type_name, _, text = rest.partition(": ")
        exc = _rebuild_python_error(type_name, f"{prefix}{head}{text}")
        return _annotate(exc, name, worker, function)
    cls = {"DEADLINE_EXCEEDED": RpcTimeoutError,
           "UNAVAILABLE": WorkerUnavailableError,
           "INVALID_ARGUMENT": InvalidArgumentError}.get(name, RpcRuntimeError)
    return _annotate(cls(f"{prefix}{name}: {message}"), name, worker, function)


def translate(error, worker=None, function=None):
    """The exception for a caught _C.StatusError."""
    code, message = error.args if len(error.args) == 2 else (2, str(error))
    return from_status(code, message, worker, function)


def status_of(exc):
    """(code number, message) for a Python exception that fails a call."""
    if isinstance(exc, RpcError):
        return CODE_NUMBERS.get(exc.code, 2), str(exc)
    import traceback
    t = type(exc)
    text = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    return 2, f"{PYTHON_ERROR_PREFIX}{t.__module__}.{t.__qualname__}: {exc}\n{text}"
